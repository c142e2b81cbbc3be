"""A restarted broker withdraws the requests its predecessor had queued, and grants none of
them: they belonged to Acquire calls the stop cut off, and nobody would hear of a grant.

Both variants of the defect: a lease that expires during the downtime must not grant a
cut-off request on the way (the withdrawal is dated when the old server was last alive),
and withdrawing one request must not grant the next (they are withdrawn in one step).
"""

from __future__ import annotations

from pathlib import Path

from conftest import build_engine, gpu_campaign

from bursar.broker.clock import ManualClock
from bursar.broker.config import default_config, parse_config
from bursar.broker.decisions import Cancelled, Granted, PreemptWarned
from bursar.broker.envelope import LeaseClass
from bursar.broker.events import CancelRequest, RequestLease
from bursar.broker.journal import Journal
from bursar.broker.runtime import Runtime
from bursar.broker.service.core import ServiceCore
from bursar.broker.snapshot import fingerprint, restore

POOL = """
[pool]
boot_latency_s = 30
[pool.groups.n]
count = 2
warm = 2
gpu = 4
[policy]
grace_s = 5
power_down_idle_s = 600
[policy.warm_headroom]
gpu = 0
[campaigns.a.gpu]
sustained = 8
burst = 8
[campaigns.b.gpu]
sustained = 4
burst = 6
[campaigns.bf]
class = "opportunistic"
preemptible = true
[campaigns.bf.gpu]
sustained = 8
burst = 8
"""


def _decisions(core: ServiceCore) -> list[object]:
    return [d for _, _, ds in core.runtime.journal.entries() for d in ds]


def test_a_lease_expiring_in_the_downtime_grants_no_cut_off_request(tmp_path: Path) -> None:
    config = parse_config(POOL, "toml", source="<test>")
    with Runtime.open(tmp_path, config) as rt:
        rt.submit(RequestLease(1.0, campaign="a", size={"gpu": 8}, duration_s=4))  # L1
        out = rt.submit(RequestLease(2.0, campaign="b", size={"gpu": 2}, duration_s=60))
        assert out.own.request_id == "L2"  # queued: the pool is full
    # The server died at t=2; it restarts at t=10, after L1's expiry at t=5.
    core = ServiceCore.open(tmp_path, config, clock=ManualClock(10.0))
    try:
        ds = _decisions(core)
        assert not any(isinstance(d, Granted) and d.lease_id == "L2" for d in ds)
        cancel = next(d for d in ds if isinstance(d, Cancelled))
        assert (cancel.request_id, cancel.at) == ("L2", 2.0)
        assert core.runtime.engine.pending == {}
    finally:
        core.close()


def test_withdrawing_one_queued_request_does_not_grant_the_next(tmp_path: Path) -> None:
    config = parse_config(POOL, "toml", source="<test>")
    with Runtime.open(tmp_path, config) as rt:
        rt.submit(RequestLease(1.0, campaign="b", size={"gpu": 4}, duration_s=600))  # L1
        rt.submit(RequestLease(1.0, campaign="bf", size={"gpu": 4}, duration_s=600))  # L2
        q3 = rt.submit(RequestLease(2.0, campaign="b", size={"gpu": 4}, duration_s=60))
        q4 = rt.submit(RequestLease(2.0, campaign="b", size={"gpu": 2}, duration_s=60))
        assert (q3.own.request_id, q4.own.request_id) == ("L3", "L4")  # L4 waits behind L3
    core = ServiceCore.open(tmp_path, config, clock=ManualClock(3.0))
    try:
        ds = _decisions(core)
        # L4 would be granted by reclaiming backfill once L3 is gone, if they were
        # withdrawn one at a time.
        assert not any(isinstance(d, Granted | PreemptWarned) for d in ds if d.at >= 2.0)
        assert {d.request_id for d in ds if isinstance(d, Cancelled)} == {"L3", "L4"}
        assert core.runtime.engine.leases["L2"].state.value == "active"
    finally:
        core.close()


def test_one_cancel_withdraws_several_requests_before_any_admission():
    eng = build_engine(
        nodes=1,
        warm=1,
        warm_headroom={},
        campaigns=[
            gpu_campaign("b", 0, 4, 6),
            gpu_campaign("bf", 0, 8, 8, None, LeaseClass.OPPORTUNISTIC, preemptible=True),
        ],
    )
    eng.apply(RequestLease(0, campaign="b", size={"gpu": 4}, duration_s=600))  # L1
    eng.apply(RequestLease(0, campaign="bf", size={"gpu": 4}, duration_s=600))  # L2
    eng.apply(RequestLease(1, campaign="b", size={"gpu": 4}, duration_s=60))  # L3 over burst
    eng.apply(RequestLease(1, campaign="b", size={"gpu": 2}, duration_s=60))  # L4 behind it
    out = eng.apply(CancelRequest(2, request_id="L3", also=("L4",)))
    assert [type(d).__name__ for d in out] == ["Cancelled", "Cancelled"]
    assert out.own.request_id == "L3" and eng.pending == {}


def test_a_long_downtime_is_caught_up_in_one_entry_before_serving(tmp_path: Path) -> None:
    """Idle nodes the warm reserve needs are looked at again every power_down_idle_s: a
    month of downtime used to come back as one journal entry per look (thousands), and
    the leases that ended meanwhile only ended once the timer task ran."""
    config = default_config()
    with Runtime.open(tmp_path, config) as rt:
        rt.submit(RequestLease(1.0, "victim", {"gpu": 8}, 600))
        before = rt.journal.last_seq
    month = 30 * 86_400.0
    core = ServiceCore.open(tmp_path, clock=ManualClock(month))
    try:
        assert core.engine.now == month and not core.engine.leases  # L1 expired meanwhile
        assert core.runtime.journal.last_seq - before <= 2
        with Journal.open(tmp_path / "journal.sqlite") as j:
            assert fingerprint(restore(j, tmp_path)[0]) == fingerprint(core.engine)
    finally:
        core.close()
