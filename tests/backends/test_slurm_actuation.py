"""Allocations off the request path, on a real Slurm cluster (scripts/slurm-cluster.sh).

While one lease's ``salloc`` takes long, the served broker answers every other call: warm
acquire + release cycles (each an salloc and an scancel) take what they take with nothing
slow in flight. Two kinds of slow: an salloc started late (``delayed_salloc``: Slurm sees
nothing unusual), and an salloc that waits for a node another job holds, until
``allocate_timeout_s``, and then fails: the lease ends as revoked with Slurm's answer, and
its holder hears it on its Watch stream.
"""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from client_support import until
from slurm_support import (
    delayed_salloc,
    job_prefix_fixture,  # noqa: F401  (fixtures: job_prefix, slurm_cluster)
    jobs_named,
    salloc,
    slurm_broker,
    slurm_cluster_fixture,  # noqa: F401
)

from bursar.providers.client import (
    Backoff,
    BrokerClient,
    Lease,
    LeaseEventKind,
    LeaseState,
    NotFound,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

FAST = Backoff(initial_s=0.05, max_s=0.5)
SLOW_S = 6.0
"""How long the slow allocation takes."""


def _cycle(client: BrokerClient) -> float:
    """Seconds for one warm acquire (an salloc) and its release (an scancel)."""
    t0 = time.monotonic()
    lease = client.acquire({"cpu": 2}, 60, blocking=False)
    assert lease.allocation["backend"] == "slurm"
    client.release(lease.id)
    return time.monotonic() - t0


def _cycles_while(thread: threading.Thread, client: BrokerClient, n: int) -> list[float]:
    """Time up to ``n`` cycles, those that finished while ``thread`` still ran."""
    took: list[float] = []
    try:
        while len(took) < n:
            t = _cycle(client)
            if not thread.is_alive():
                break  # this one may have run after the slow one ended
            took.append(t)
    finally:
        thread.join(SLOW_S + 60)
    return took


def _granted(client: BrokerClient, lease_id: str) -> bool:
    try:
        return client.get_lease(lease_id).state is LeaseState.ACTIVE
    except NotFound:
        return False


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def test_a_slow_allocation_holds_up_no_other_request(tmp_path: Path, job_prefix: str) -> None:
    pre = job_prefix
    cli = delayed_salloc({f"{pre}-L2"}, SLOW_S)
    with (
        slurm_broker(tmp_path / "state", pre, cli=cli) as served,
        BrokerClient(served.address, served.tokens["sci"], backoff=FAST) as sci,
        BrokerClient(served.address, served.tokens["wf"], backoff=FAST) as wf,
    ):
        held = sci.acquire({"cpu": 1}, 600, blocking=False)
        events = sci.watch()
        first = next(events)  # the stream is open: it hears everything from here on
        assert (first.snapshot, first.lease.id) == (True, held.id)

        def slow() -> tuple[Lease, float]:
            t0 = time.monotonic()
            return sci.acquire({"gpu": 8}, 600, blocking=False), time.monotonic() - t0

        box: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: box.setdefault("out", slow()))
        thread.start()
        # Granted and journaled at once; its allocation is still being made.
        until(lambda: _granted(sci, "L2"), 10, "L2 to be granted")
        took = _cycles_while(thread, wf, 10)
        baseline = [_cycle(wf) for _ in range(5)]
        # Every cycle ran while L2's allocation was being made, as fast as with none.
        assert len(took) == 10, (took, baseline)
        assert _median(took) < 2 * _median(baseline) + 0.05, (took, baseline)
        assert max(took) < SLOW_S / 4, (took, baseline)
        lease, waited = box["out"]
        # The slow Acquire answered once its allocation was ready, and carries it.
        assert waited >= SLOW_S and lease.state is LeaseState.ACTIVE
        assert lease.allocation["backend"] == "slurm" and lease.allocation["nodes"]
        # Its holder's stream heard the grant at once, then the allocation once it was
        # ready, journaled after the other leases' cycles.
        l2 = list(itertools.islice((e for e in events if e.lease.id == "L2"), 2))
        assert [e.kind for e in l2] == [LeaseEventKind.GRANTED, LeaseEventKind.ALLOCATED]
        assert not l2[0].lease.allocation and not any(e.snapshot for e in l2)
        assert l2[1].lease.allocation["job_id"] == lease.allocation["job_id"]
        assert l2[0].seq < l2[1].seq
        events.close()


def test_an_allocation_slurm_cannot_make_ends_its_lease_and_holds_up_nothing(
    tmp_path: Path, job_prefix: str
) -> None:
    pre = job_prefix
    # Another user's job holds node4 whole: the broker does not know, and the lease it
    # places there waits in salloc until allocate_timeout_s, then fails.
    hog = salloc(f"other-{pre}", "-w", "node4", "--exclusive")
    try:
        with (
            slurm_broker(tmp_path / "state", pre, allocate_timeout_s=int(SLOW_S)) as served,
            BrokerClient(served.address, served.tokens["sci"], backoff=FAST) as sci,
            BrokerClient(served.address, served.tokens["wf"], backoff=FAST) as wf,
        ):
            # Nodes 1-3 whole, so that the next GPU lease can only go on node4.
            big = sci.acquire({"gpu": 24}, 600, blocking=False)
            assert big.allocation["nodes"] == "node1,node2,node3"
            events = sci.watch()
            first = next(events)  # the stream is open: it hears everything from here on
            assert (first.snapshot, first.lease.id) == (True, big.id)
            box: dict[str, Any] = {}
            thread = threading.Thread(
                target=lambda: box.setdefault("out", sci.acquire({"gpu": 8}, 600, blocking=False))
            )
            thread.start()
            # L2's salloc is under way once Slurm has its (pending) job.
            until(lambda: jobs_named(f"{pre}-L2", live=False), 10, "L2's salloc")
            took = _cycles_while(thread, wf, 5)
            # Slurm starts the others from backfill while a job waits (bf_interval = 1 s in
            # the test cluster), but none waits for the pending salloc.
            assert len(took) >= 3 and max(took) < SLOW_S / 2, took
            lease = box["out"]
            assert lease.state is LeaseState.REVOKED
            assert lease.end_cause.startswith("slurm: salloc")
            # Its holder hears it on the stream: granted, then revoked with the cause.
            seen = []
            for ev in events:
                if ev.lease.id == "L2":
                    seen.append(ev.kind)
                    if ev.kind is LeaseEventKind.REVOKED:
                        assert ev.cause == lease.end_cause
                        break
            assert seen == [LeaseEventKind.GRANTED, LeaseEventKind.REVOKED]
            events.close()
    finally:
        subprocess.run(["scancel", str(hog)], check=True)
