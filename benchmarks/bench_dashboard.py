"""The dashboard's cost to the broker: Acquire + Release pairs/s with 10 dashboard event
streams connected, against none, in one run.

Run: ``.venv/bin/python benchmarks/bench_dashboard.py [--clients 16] [--seconds 3]
[--rounds 3] [--streams 10]``.

One ``bursar serve`` subprocess (the 512-GPU pool of ``bench_service.py``, durability
normal, rate limits out of the way, its dashboard on a free loopback port) is driven by
``bench_service``'s clients (``--clients`` asyncio clients looping Acquire(1 GPU) then
Release) for ``--seconds`` per measurement. Each round measures it twice: with no
dashboard stream open, and with ``--streams`` admin-token streams on ``/api/events``
(each gets every lease event and a full state at most every 0.25 s), read by a separate
process so that reading them costs the driver nothing. The order flips every round.
Prints both rates per round and the median and range of the per-round ratio (with
streams / without), and the events the streams received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_service import POOL, _drive

PROFILE: list[str] = []
"""Interpreter options for the server (a profiling run sets them)."""


async def _streams(url: str, token: str, n: int) -> None:
    """``n`` event streams, each read to the end; prints ``connected`` once every one has
    its opening state, and the events read when stopped (SIGTERM)."""
    import aiohttp

    counts = [0] * n
    opened = 0
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def one(k: int, http: aiohttp.ClientSession) -> None:
        nonlocal opened
        headers = {"Authorization": f"Bearer {token}"}
        async with http.get(url + "api/events", headers=headers) as r:
            first = True
            # Counted in chunks, not parsed line by line: on a small machine this reader
            # shares the cores with the broker, and must cost it as little as it can.
            async for chunk in r.content.iter_any():
                counts[k] += chunk.count(b"event:")
                if first and counts[k]:
                    first = False
                    opened += 1
                    if opened == n:
                        print("connected", flush=True)

    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.ensure_future(one(k, http)) for k in range(n)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"events": sum(counts)}), flush=True)


def _lines_until(proc: subprocess.Popen[str], marker: str, timeout_s: float = 30) -> str:
    """The first line of ``proc``'s output holding ``marker`` (read on a thread: a line
    already in the pipe's buffer is never seen by a select on the pipe)."""
    assert proc.stdout is not None
    stdout = proc.stdout
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stdout:
            if marker in line:
                found.put(line)
                return
        found.put("")

    threading.Thread(target=read, daemon=True).start()
    try:
        line = found.get(timeout=timeout_s)
    except queue.Empty:
        line = ""
    if not line:
        raise RuntimeError(f"no {marker!r} from {proc.args}")
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="Concurrent gRPC clients.")
    parser.add_argument("--seconds", type=float, default=3.0, help="Seconds per measurement.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds (each: with and without).")
    parser.add_argument("--streams", type=int, default=10, help="Dashboard streams.")
    parser.add_argument("--read-streams", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_streams:
        url, token, n = args.read_streams
        asyncio.run(_streams(url, token, int(n)))
        return

    without: list[tuple[float, float]] = []
    with_streams: list[tuple[float, float]] = []
    events: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bursar-bench-") as tmp:
        cfg = Path(tmp) / "pool.toml"
        cfg.write_text(POOL)
        state = Path(tmp) / "state"
        server = subprocess.Popen(
            [
                sys.executable, *PROFILE, "-m", "bursar.broker.service", "--state-dir", str(state),
                "--config", str(cfg), "--port", "0", "--no-metrics", "--dashboard-port", "0",
                "--durability", "normal", "--rate-limit", "1e9", "--rate-burst", "1e9",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            address = _lines_until(server, "listening on").split("listening on ", 1)[1].split()[0]
            # "dashboard: http://HOST:PORT/?login=CODE": the streams use the admin token.
            link = _lines_until(server, "dashboard: ").split("dashboard: ", 1)[1].split()[0]
            url = link.split("?", 1)[0]
            token = json.loads((state / "tokens.json").read_text())["bench"]
            admin = (state / "admin.token").read_text().strip()

            def measure() -> tuple[float, float]:
                r = asyncio.run(_drive(address, token, args.clients, args.seconds, server.pid))
                return r.rate, r.cpu_us_per_op

            for rnd in range(args.rounds):
                for streams_on in (False, True) if rnd % 2 == 0 else (True, False):
                    if not streams_on:
                        without.append(measure())
                        continue
                    reader = subprocess.Popen(
                        [sys.executable, __file__, "--read-streams", url, admin, str(args.streams)],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    try:
                        _lines_until(reader, "connected")
                        with_streams.append(measure())
                    finally:
                        reader.send_signal(signal.SIGTERM)
                        out, _ = reader.communicate(timeout=30)
                    events.append(json.loads(out.strip().splitlines()[-1])["events"])
        finally:
            server.terminate()
            server.wait(timeout=30)

    ratios = sorted(w[0] / o[0] for w, o in zip(with_streams, without, strict=True))
    print(
        f"Acquire+Release pairs/s, {args.clients} gRPC clients, {args.seconds:g} s per "
        f"measurement, {args.rounds} rounds (order flipped each round)"
    )
    print(
        f"{'round':>5} | {'no streams':>10} {'cpu us':>7} | {args.streams:>2} streams "
        f"{'cpu us':>7} | {'ratio':>5} | events"
    )
    for k, (o, w, e) in enumerate(zip(without, with_streams, events, strict=True)):
        print(
            f"{k:>5} | {o[0]:>10.0f} {o[1]:>7.0f} | {w[0]:>10.0f} {w[1]:>7.0f} | "
            f"{w[0] / o[0]:>5.2f} | {e}"
        )
    a, b = [x[0] for x in without], [x[0] for x in with_streams]
    print(
        f"median: no streams {statistics.median(a):.0f} pairs/s [{min(a):.0f}-{max(a):.0f}], "
        f"{args.streams} streams {statistics.median(b):.0f} [{min(b):.0f}-{max(b):.0f}]; "
        f"ratio {statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
    )
    print(
        "(cpu us: the broker process's CPU time per pair, which the load of neighbours on "
        "the machine moves less than the rates)"
    )


if __name__ == "__main__":
    main()
