"""Restart time against journal length: snapshot + tail against a full replay.

    .venv/bin/python benchmarks/bench_restart.py [--decisions 100000,1000000] [--repeat 3]
        [--full-max 1000000] [--every 10000] [--work out/bench-restart]

For each size, builds (once, cached under ``--work``) a broker state directory whose
journal holds that many decisions: a 512-GPU pool, 20 campaigns, a seeded mix of
blocking and non-blocking requests, releases and renewals, applied by the engine and
journaled as ``bursar serve`` journals them, with a snapshot every ``--every`` entries as
``bursar serve --snapshot-every`` takes them. Generation stops one entry short of the next
snapshot: the restart then replays the longest tail it can meet (``--every`` - 1 entries).

Then, ``--repeat`` times each:

* **snapshot restore** (in process): ``snapshot.restore``, the newest snapshot loaded and
  the tail replayed, as ``Runtime.open`` does;
* **full replay** (in process, sizes up to ``--full-max``): every entry replayed, as a
  restart did before snapshots (the baseline of the ratio);
* **to SERVING** (a real process): ``python -m bursar.broker.service --state-dir DIR``
  spawned until the standard health service answers SERVING on its port: imports, journal
  open, restore, the clock catching up on the downtime, the withdrawal of requests queued
  at the end, tokens, the listening socket.

Prints each as median [min-max] seconds, and the full replay's time as a multiple of the
snapshot restore's. Generating 10 million decisions takes about 20 minutes on a 2-core
machine (once; the state directory is kept); the full replay of it about as long.
"""

from __future__ import annotations

import argparse
import json
import random
import selectors
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bursar.broker import events as ev
from bursar.broker import snapshot
from bursar.broker.config import parse_config
from bursar.broker.decisions import Granted
from bursar.broker.engine import Engine
from bursar.broker.errors import RequestError
from bursar.broker.journal import JOURNAL_FILENAME, Journal, replay

EVENTS_PER_S = 20.0
"""The generated workload's event rate; about 1.2 decisions per event."""

CONFIG = """
[pool]
boot_latency_s = 60
[pool.groups.w]
count = 64
warm = 64
gpu = 8
cpu = 64
mem_gb = 512
[policy]
grace_s = 30
[policy.warm_headroom]
gpu = 0
""" + "".join(
    f"""
[campaigns.c{i:02d}]
class = "batch"
[campaigns.c{i:02d}.gpu]
guarantee = {4 if i < 10 else 0}
sustained = 16
burst = 64
bucket = 1000000
"""
    for i in range(20)
)


def generate(state: Path, decisions: int, every: int, seed: int = 1) -> dict[str, float]:
    """A state directory whose journal holds at least ``decisions`` decisions."""
    cfg = parse_config(CONFIG, "toml", source="bench_restart")
    state.mkdir(parents=True, exist_ok=True)
    journal = Journal.open(state / JOURNAL_FILENAME, cfg.pool, cfg.policy)
    engine = Engine(journal.pool, journal.policy)
    rng = random.Random(seed)
    # Dated so that the journal ends about when it is generated: a restart then catches up
    # on minutes of downtime, as after a crash, not on the years since a fixed date.
    t = time.time() - decisions / (1.2 * EVENTS_PER_S)
    batch: list[tuple[ev.Event, list]] = []
    for spec in cfg.campaigns:
        e = ev.CreateCampaign(at=t, spec=spec)
        batch.append((e, engine.apply(e).decisions))
    names = [s.name for s in cfg.campaigns]
    held: list[str] = []
    made = 0
    t0 = time.perf_counter()
    last_print = t0

    def flush() -> None:
        seqs = journal.append_many(batch)
        batch.clear()
        for seq in seqs:
            if seq % every == 0:
                snapshot.write(state, journal, seq, engine.now, capture_at[seq])
        capture_at.clear()

    capture_at: dict[int, bytes] = {}
    while True:
        seq_next = journal.last_seq + len(batch) + 1
        if made >= decisions and seq_next % every == 0:
            break  # one short of the next snapshot: the longest tail
        t += rng.expovariate(EVENTS_PER_S)
        r = rng.random()
        if r < 0.55 or not held:
            e = ev.RequestLease(
                at=t,
                campaign=rng.choice(names),
                size={"gpu": rng.choice((1, 2, 4, 8))},
                duration_s=rng.choice((60.0, 300.0, 900.0)),
                blocking=rng.random() < 0.5,
            )
        elif r < 0.9:
            e = ev.Release(at=t, lease_id=held.pop(rng.randrange(len(held))))
        else:
            e = ev.Renew(at=t, lease_id=rng.choice(held), duration_s=600.0)
        try:
            out = engine.apply(e)
        except RequestError:
            continue  # a release of a lease that expired meanwhile: not journaled
        made += len(out.decisions)
        held += [d.lease_id for d in out.decisions if isinstance(d, Granted)]
        if len(held) > 4 * len(engine.leases) + 100:
            held = [h for h in held if h in engine.leases]
        batch.append((e, out.decisions))
        if seq_next % every == 0:
            capture_at[seq_next] = snapshot.capture(engine)
        if len(batch) >= 5_000:
            flush()
            now = time.perf_counter()
            if now - last_print > 30:
                rate = made / (now - t0)
                eta = (decisions - made) / rate if rate else 0
                print(f"    {made:,} decisions, {rate:,.0f}/s, about {eta / 60:.0f} min left")
                last_print = now
    flush()
    journal.update_index()
    info = {
        "decisions": made,
        "entries": journal.last_seq,
        "generate_s": round(time.perf_counter() - t0, 1),
        "journal_mb": round((state / JOURNAL_FILENAME).stat().st_size / 1e6, 1),
        "every": every,
        "code": snapshot.code_fingerprint(),
    }
    journal.close()
    (state / "generated.json").write_text(json.dumps(info))
    return info


def cached(work: Path, decisions: int, every: int) -> tuple[Path, dict[str, float]]:
    state = work / f"d{decisions}-e{every}"
    marker = state / "generated.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info.get("code") == snapshot.code_fingerprint():
            return state, info
        print("    the engine's code changed since it was generated: generating again")
    if state.exists():
        shutil.rmtree(state)
    print(f"    generating {decisions:,} decisions into {state} (once)")
    return state, generate(state, decisions, every)


def restore_s(state: Path) -> tuple[float, int, float]:
    """Seconds to restore, entries replayed after the snapshot, and seconds one capture of
    the restored engine takes (the pause a snapshot costs the engine's thread)."""
    with Journal.open(state / JOURNAL_FILENAME) as j:
        t0 = time.perf_counter()
        engine, used = snapshot.restore(j, state)
        took = time.perf_counter() - t0
        t1 = time.perf_counter()
        snapshot.capture(engine)
        return took, j.last_seq - used, time.perf_counter() - t1


def full_replay_s(state: Path) -> float:
    with Journal.open(state / JOURNAL_FILENAME) as j:
        t0 = time.perf_counter()
        replay(j)
        return time.perf_counter() - t0


def to_serving_s(state: Path) -> float:
    """Spawn ``bursar serve`` on the state directory; seconds until health says SERVING."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bursar.broker.service",
            "--state-dir",
            str(state),
            "--port",
            "0",
            "--no-metrics",
            "--no-dashboard",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        address = None
        while address is None:
            if not sel.select(timeout=600):
                raise RuntimeError("bursar serve said nothing for 10 minutes")
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"bursar serve exited: {proc.stderr.read()}")  # type: ignore[union-attr]
            if "listening on " in line:
                address = line.split("listening on ", 1)[1].split()[0]
        with grpc.insecure_channel(address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.perf_counter() - t0
                time.sleep(0.01)
    finally:
        # Killed, as a crash would: a clean stop writes one more snapshot, and the next
        # restart would then replay nothing.
        proc.kill()
        proc.wait(timeout=60)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--decisions", default="100000,1000000", help="comma-separated sizes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--full-max", type=int, default=1_000_000, help="largest size fully replayed")
    ap.add_argument("--every", type=int, default=snapshot.EVERY, help="entries per snapshot")
    ap.add_argument("--work", type=Path, default=Path("out/bench-restart"))
    args = ap.parse_args()
    sizes = [int(float(x)) for x in args.decisions.split(",") if x]
    rows = []
    for n in sizes:
        print(f"== {n:,} decisions")
        state, info = cached(args.work, n, args.every)
        print(
            f"   journal: {info['entries']:,} entries, {info['decisions']:,} decisions, "
            f"{info['journal_mb']:,} MB (generated in {info['generate_s']:,} s)"
        )
        restores, captures, tail = [], [], 0
        for _ in range(args.repeat):
            s, tail, c = restore_s(state)
            restores.append(s)
            captures.append(c)
        print(f"   snapshot restore: {spread(restores)} ({tail:,} entries replayed after it)")
        print(f"   one snapshot capture (the engine's thread): {spread(captures)}")
        serving = [to_serving_s(state) for _ in range(args.repeat)]
        print(f"   bursar serve to SERVING: {spread(serving)}")
        row = {
            "decisions": n,
            "restore": restores,
            "capture": captures,
            "serving": serving,
            "tail": tail,
        }
        if n <= args.full_max:
            full = [full_replay_s(state) for _ in range(args.repeat)]
            ratio = statistics.median(full) / statistics.median(restores)
            print(f"   full replay: {spread(full)} = {ratio:,.0f}x the snapshot restore")
            row["full"] = full
        rows.append(row)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
