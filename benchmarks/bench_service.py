"""gRPC service throughput and latency: Acquire + Release pairs against `bursar serve`.

Run: ``.venv/bin/python benchmarks/bench_service.py [--clients 1,16,64] [--seconds 3]
[--rounds 3] [--postgres URL|private] [--before REV]``.

With ``--before REV`` (a git revision of this repository), another ``bursar serve`` takes
its turn in every round: the same command and config, run from REV's tree (exported with
``git archive`` to a temporary directory and put first on its ``PYTHONPATH``), so that a
change's before and after are measured in one run, on the same machine at the same time;
its pairs/s per round are printed beside this tree's.

With ``--postgres``, a third server takes its turn in every round: ``bursar serve
--journal URL`` (an empty database; ``private``: a PostgreSQL server started for the run
under a temporary directory, as the tests start theirs, from Debian's ``postgresql``), and
its figures are printed beside the SQLite journal's.

Two servers run as subprocesses on loopback, both up for the whole run and driven in turn:

* ``bursar serve`` (``python -m bursar.broker.service``) with a 512-GPU pool, the journal
  durable as in production (``--durability normal``: WAL, committed before each answer),
  bearer-token auth on every call, rate limits raised out of the way;
* an **empty** grpc.aio server with the same two methods (``/bursar.v1.Broker/Acquire``
  and ``/Release``) that parses the request and returns a canned response: the cost of
  gRPC and Python alone.

For each concurrency level, that many asyncio clients (sharing up to 8 channels) each loop
``Acquire(1 GPU, non-blocking)`` then ``Release`` for ``--seconds``; one pair is one op.
Each level runs on both servers once per round, the rounds interleaved (bursar first in
even rounds, the empty handler first in odd ones). Prints, per level, the median ops/s and
p50/p99 latency of a pair for both servers over the rounds, and the median and range of
the per-round ratio of Bursar's throughput to the empty handler's; then every round's p99,
and the CPU time each server process spent per pair. The client runs in this process, so on
a small machine the clients and the server compete for the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from bursar.protos.bursar.v1 import broker_pb2 as pb

POOL = """
[pool]
boot_latency_s = 60
[pool.groups.node]
count = 64
warm = 64
gpu = 8
cpu = 64
mem_gb = 512
[policy]
grace_s = 30
[campaigns.bench]
class = "batch"
[campaigns.bench.gpu]
sustained = 512
burst = 512
"""

ACQUIRE = "/bursar.v1.Broker/Acquire"
RELEASE = "/bursar.v1.Broker/Release"


# ----------------------------------------------------------------------------- servers


async def _empty_server() -> None:
    """The baseline: same methods, same messages, no work."""
    lease = pb.Lease(lease_id="L1", campaign="bench", state=pb.LEASE_STATE_ACTIVE)
    lease.size["gpu"] = 1
    acquired = pb.AcquireResponse(lease=lease, price=1.0)
    released = pb.ReleaseResponse(lease=lease)

    async def acquire(req: pb.AcquireRequest, ctx: grpc.aio.ServicerContext) -> pb.AcquireResponse:
        ctx.invocation_metadata()
        return acquired

    async def release(req: pb.ReleaseRequest, ctx: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        ctx.invocation_metadata()
        return released

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bursar.v1.Broker",
                {
                    "Acquire": grpc.unary_unary_rpc_method_handler(
                        acquire,
                        request_deserializer=pb.AcquireRequest.FromString,
                        response_serializer=pb.AcquireResponse.SerializeToString,
                    ),
                    "Release": grpc.unary_unary_rpc_method_handler(
                        release,
                        request_deserializer=pb.ReleaseRequest.FromString,
                        response_serializer=pb.ReleaseResponse.SerializeToString,
                    ),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


class Subprocess:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sel.select(timeout=deadline - time.monotonic()):
            line = self.proc.stdout.readline()
            if "listening on" in line:
                self.address = line.split("listening on ", 1)[1].split()[0]
                return
            if not line:
                break
        raise RuntimeError(f"server did not start: {args}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# ----------------------------------------------------------------------------- clients


@dataclass
class Result:
    ops: int
    seconds: float
    latencies: list[float]
    server_cpu_s: float = 0.0
    """CPU seconds the server process used while measuring (user + system, all threads)."""

    @property
    def cpu_us_per_op(self) -> float:
        return self.server_cpu_s / max(1, self.ops) * 1e6

    @property
    def rate(self) -> float:
        return self.ops / self.seconds

    def pct(self, q: float) -> float:
        qs = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return qs[int(q) - 1] * 1000


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(address: str, token: str, clients: int, seconds: float, pid: int = 0) -> Result:
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(clients, 8))]
    md = (("authorization", f"Bearer {token}"),)
    latencies: list[float] = []
    stop_at = 0.0

    async def client(k: int, record: bool) -> None:
        ch = channels[k % len(channels)]
        acquire = ch.unary_unary(
            ACQUIRE,
            request_serializer=pb.AcquireRequest.SerializeToString,
            response_deserializer=pb.AcquireResponse.FromString,
        )
        release = ch.unary_unary(
            RELEASE,
            request_serializer=pb.ReleaseRequest.SerializeToString,
            response_deserializer=pb.ReleaseResponse.FromString,
        )
        req = pb.AcquireRequest(size={"gpu": 1}, duration_s=600)
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            got = await acquire(req, metadata=md)
            await release(pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=md)
            if record:
                latencies.append(time.perf_counter() - t0)

    try:
        stop_at = time.perf_counter() + min(0.5, seconds / 4)  # warm-up
        await asyncio.gather(*(client(k, False) for k in range(clients)))
        cpu0 = _cpu_s(pid)
        start = time.perf_counter()
        stop_at = start + seconds
        await asyncio.gather(*(client(k, True) for k in range(clients)))
        elapsed = time.perf_counter() - start
        cpu = _cpu_s(pid) - cpu0
    finally:
        for ch in channels:
            await ch.close()
    return Result(len(latencies), elapsed, latencies, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16,64", help="Concurrency levels, comma-separated.")
    parser.add_argument("--seconds", type=float, default=3.0, help="Measured seconds per level.")
    parser.add_argument(
        "--rounds", type=int, default=3, help="Interleaved rounds (each level on both servers)."
    )
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="Also drive bursar serve on a PostgreSQL journal (an empty database), or "
        "'private' for a server started for the run.",
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        help="Also drive bursar serve as of git revision REV (e.g. HEAD~1), in the same rounds.",
    )
    parser.add_argument("--serve-empty", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.postgres == "private":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from pg_support import postgres_server

        with postgres_server() as server:
            args.postgres = server.new_database()
            _run(args)
        return
    _run(args)


PACKAGES = ("broker", "cli", "protos", "providers", "sim", "testing", "workflows")
"""The repository's folders that make up the ``bursar`` package (see pyproject.toml)."""


def _export(rev: str, into: Path) -> dict[str, str]:
    """The environment that runs ``bursar`` as of git revision ``rev``: its tree exported
    under ``into``, a ``bursar`` package of links to its folders first on the path."""
    root = Path(__file__).resolve().parent.parent
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    package = into / "path" / "bursar"
    package.mkdir(parents=True)
    for name in PACKAGES:
        if (tree / name).is_dir():
            (package / name).symlink_to(tree / name)
    return {**os.environ, "PYTHONPATH": str(into / "path")}


def _run(args: argparse.Namespace) -> None:
    if args.serve_empty:
        asyncio.run(_empty_server())
        return
    levels = [int(x) for x in args.clients.split(",")]
    ours: dict[int, list[Result]] = {c: [] for c in levels}
    base: dict[int, list[Result]] = {c: [] for c in levels}
    on_pg: dict[int, list[Result]] = {c: [] for c in levels}
    before: dict[int, list[Result]] = {c: [] for c in levels}

    with tempfile.TemporaryDirectory(prefix="bursar-bench-") as tmp:
        cfg = Path(tmp) / "pool.toml"
        cfg.write_text(POOL)
        state = Path(tmp) / "state"
        bursar = Subprocess(
            [
                sys.executable, "-m", "bursar.broker.service", "--state-dir", str(state),
                "--config", str(cfg), "--port", "0", "--no-metrics", "--no-dashboard", "--durability", "normal",
                "--rate-limit", "1e9", "--rate-burst", "1e9",
            ]
        )  # fmt: skip
        pg = old = empty = None
        try:
            empty = Subprocess([sys.executable, os.path.abspath(__file__), "--serve-empty"])
            if args.before:
                old_state = Path(tmp) / "before-state"
                old = Subprocess(
                    [
                        sys.executable, "-m", "bursar.broker.service", "--state-dir", str(old_state),
                        "--config", str(cfg), "--port", "0", "--no-metrics", "--no-dashboard",
                        "--durability", "normal", "--rate-limit", "1e9", "--rate-burst", "1e9",
                    ],
                    env=_export(args.before, Path(tmp) / "before"),
                )  # fmt: skip
                old_token = json.loads((old_state / "tokens.json").read_text())["bench"]
            if args.postgres:
                pg_state = Path(tmp) / "pg-state"
                pg = Subprocess(
                    [
                        sys.executable, "-m", "bursar.broker.service", "--state-dir", str(pg_state),
                        "--config", str(cfg), "--port", "0", "--no-metrics", "--no-dashboard",
                        "--journal", args.postgres, "--rate-limit", "1e9", "--rate-burst", "1e9",
                    ]
                )  # fmt: skip
                pg_token = json.loads((pg_state / "tokens.json").read_text())["bench"]
        except BaseException:
            for started in (bursar, empty, old, pg):
                if started is not None:
                    started.stop()
            raise
        token = json.loads((state / "tokens.json").read_text())["bench"]
        try:
            # Both servers stay up and take turns, level by level and round by round (the
            # order flipping each round), so that a neighbour's load on a shared machine
            # falls on both sides of a ratio rather than on one server's whole run.
            for r in range(args.rounds):
                for c in levels:
                    pair = [(ours, bursar, token), (base, empty, token)]
                    if pg is not None:
                        pair.insert(1, (on_pg, pg, pg_token))
                    if old is not None:
                        pair.insert(1, (before, old, old_token))
                    for results, server, key in pair if r % 2 == 0 else pair[::-1]:
                        results[c].append(
                            asyncio.run(
                                _drive(server.address, key, c, args.seconds, server.proc.pid)
                            )
                        )
        finally:
            bursar.stop()
            empty.stop()
            if pg is not None:
                pg.stop()
            if old is not None:
                old.stop()
        entries = _journal_entries(state)

    print(
        f"Acquire+Release pairs over loopback gRPC, {args.seconds:g} s per level, "
        f"{args.rounds} interleaved rounds, {os.cpu_count()} CPUs; journal durability=normal "
        f"({entries} entries written)"
    )
    head = (
        f"{'clients':>7} | {'bursar ops/s':>12} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'empty ops/s':>11} {'p50 ms':>7} {'p99 ms':>7} | {'ratio median [range]':>20}"
    )
    print(head)
    print("-" * len(head))
    for c in levels:
        o, b = ours[c], base[c]
        ratios = sorted(x.rate / y.rate for x, y in zip(o, b, strict=True))
        print(
            f"{c:>7} | {_med(x.rate for x in o):>12.0f} {_med(x.pct(50) for x in o):>7.2f} "
            f"{_med(x.pct(99) for x in o):>7.2f} | {_med(x.rate for x in b):>11.0f} "
            f"{_med(x.pct(50) for x in b):>7.2f} {_med(x.pct(99) for x in b):>7.2f} | "
            f"{statistics.median(ratios):>5.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
        )
    print("(ops/s and latencies: the median over the rounds; ratio: per round, bursar/empty)")
    print(
        "server CPU per pair, median (us; each server process's own CPU time, which a "
        "neighbour's load moves less than the rates): "
        + ", ".join(
            f"{c} clients bursar {_med(x.cpu_us_per_op for x in ours[c]):.0f} / empty "
            f"{_med(x.cpu_us_per_op for x in base[c]):.0f}"
            for c in levels
        )
    )
    if args.postgres:
        print(
            "the same bursar serve with its journal in PostgreSQL (--journal, same rounds), "
            "beside the SQLite journal:"
        )
        print(
            f"{'clients':>7} | {'sqlite ops/s':>12} {'p99 ms':>7} | {'postgresql ops/s':>16} {'p99 ms':>7}"
        )
        for c in levels:
            print(
                f"{c:>7} | {_med(x.rate for x in ours[c]):>12.0f} "
                f"{_med(x.pct(99) for x in ours[c]):>7.2f} | "
                f"{_med(x.rate for x in on_pg[c]):>16.0f} {_med(x.pct(99) for x in on_pg[c]):>7.2f}"
            )
    if args.before:
        print(f"bursar serve as of {args.before} (before) and this tree (after), same rounds:")
        print(
            f"{'clients':>7} | {'before ops/s [range]':>22} | {'after ops/s [range]':>22} | "
            "CPU us per pair before / after"
        )
        for c in levels:
            b, a = sorted(x.rate for x in before[c]), sorted(x.rate for x in ours[c])
            print(
                f"{c:>7} | {_med(b):>8.0f} [{b[0]:.0f}-{b[-1]:.0f}]{'':>3} | "
                f"{_med(a):>8.0f} [{a[0]:.0f}-{a[-1]:.0f}]{'':>3} | "
                f"{_med(x.cpu_us_per_op for x in before[c]):.0f} / "
                f"{_med(x.cpu_us_per_op for x in ours[c]):.0f}"
            )
    for c in levels:
        print(
            f"p99 ms at {c} clients, per round: bursar "
            + " ".join(f"{x.pct(99):.2f}" for x in ours[c])
            + " | empty "
            + " ".join(f"{x.pct(99):.2f}" for x in base[c])
        )


def _med(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def _journal_entries(state: Path) -> int:
    from bursar.broker.journal import Journal

    with Journal.open(state / "journal.sqlite") as j:
        return j.last_seq


if __name__ == "__main__":
    main()
