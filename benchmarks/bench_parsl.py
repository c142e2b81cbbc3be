"""Parsl block start through Bursar against LocalProvider, in the same run.

    .venv/bin/python benchmarks/bench_parsl.py [--trials 3]

Block start is the time from the executor's scale-out call (``provider.submit``) until
the block's first manager has registered with the interchange (first worker connected).
For each trial, one HighThroughputExecutor is loaded with ``strategy="none"`` and no
initial block, one block is scaled out and timed, and the DFK is cleaned up; trials
alternate LocalProvider and BursarProvider (each block a 2-core lease from a broker
served in-process over gRPC on loopback). Also printed: how long ``submit`` itself took
(for Bursar: the non-blocking Acquire, ``SyncLeaseHandle`` set-up included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import parsl
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

from bursar.broker.service.local import local_broker
from bursar.providers.parsl import BursarProvider


def timed_submit(provider: Any, into: list[float]) -> None:
    submit = provider.submit

    def wrapper(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return submit(*a, **kw)
        finally:
            into.append(time.perf_counter() - t0)

    provider.submit = wrapper


def one_block(provider: Any, run_dir: str) -> tuple[float, float, float]:
    """(submit → first manager registered, time inside submit, submit → workers
    launched (Bursar only; else 0)), seconds."""
    submits: list[float] = []
    timed_submit(provider, submits)
    htex = HighThroughputExecutor(
        label="htex",
        address="127.0.0.1",
        max_workers_per_node=2,
        heartbeat_period=2,
        heartbeat_threshold=10,
        provider=provider,
    )
    dfk = parsl.load(Config(executors=[htex], strategy="none", run_dir=run_dir))
    try:
        t0 = time.perf_counter()
        htex.scale_out_facade(1)
        while not htex.connected_managers():
            if time.perf_counter() - t0 > 60:
                raise TimeoutError("no manager registered within 60 s")
            time.sleep(0.01)
        start = time.perf_counter() - t0
        launched = 0.0
        if isinstance(provider, BursarProvider):
            (b,) = provider.resources.values()
            launched = (b.started_at or b.submitted_at) - b.submitted_at
        return start, submits[0], launched
    finally:
        dfk.cleanup()
        parsl.clear()
        if isinstance(provider, BursarProvider):
            provider.close()


def summary(xs: list[float]) -> str:
    return f"median {statistics.median(xs):6.3f} s  min {min(xs):6.3f} s  max {max(xs):6.3f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    results: dict[str, list[tuple[float, float, float]]] = {"local": [], "bursar": []}
    with tempfile.TemporaryDirectory(prefix="bench-parsl-") as tmp, local_broker() as b:
        for i in range(args.trials):
            results["local"].append(
                one_block(LocalProvider(init_blocks=0, min_blocks=0, max_blocks=1), f"{tmp}/l{i}")
            )
            results["bursar"].append(
                one_block(
                    BursarProvider(
                        broker=b.address,
                        campaign="sci",
                        token=b.tokens["sci"],
                        resources_per_block={"cpu": 2},
                        init_blocks=0,
                        max_blocks=1,
                    ),
                    f"{tmp}/b{i}",
                )
            )
            print(
                f"trial {i + 1}: local {results['local'][-1][0]:.3f} s, "
                f"bursar {results['bursar'][-1][0]:.3f} s",
                flush=True,
            )
    print(f"\nblock start (submit -> first worker connected), {args.trials} trials each:")
    for name, label in (("local", "LocalProvider "), ("bursar", "BursarProvider")):
        starts = [r[0] for r in results[name]]
        inside = [r[1] for r in results[name]]
        print(
            f"  {label}  {summary(starts)}   (in submit: median {statistics.median(inside) * 1000:.1f} ms)"
        )
    launched = statistics.median(r[2] for r in results["bursar"])
    print(
        f"  Bursar: submit -> lease granted and workers launched, median {launched * 1000:.1f} ms"
    )
    delta = statistics.median(r[0] for r in results["bursar"]) - statistics.median(
        r[0] for r in results["local"]
    )
    print(f"  Bursar minus Local (medians): {delta * 1000:+.0f} ms")


if __name__ == "__main__":
    main()
