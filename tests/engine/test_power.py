"""Node power (``power.py``): idle nodes power down, the reserve stays warm, timers do not change decisions. Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

from conftest import build_engine, gpu_campaign
from engine_support import gpu, kinds, one, req

from bursar.broker import codec
from bursar.broker.decisions import (
    Granted,
    LeasePath,
)
from bursar.broker.events import (
    Release,
    Tick,
)


def test_idle_node_powers_down_after_power_down_idle_s():
    eng = build_engine(nodes=2, warm=2, warm_headroom={}, campaigns=[gpu_campaign("a", 0, 16, 16)])
    eng.apply(req(0, "a", 8, 100))
    assert kinds(eng.apply(Tick(at=100))) == ["Expired"]
    assert eng.next_timer() == 700
    assert eng.apply(Tick(at=699)) == []
    out = eng.apply(Tick(at=700))
    assert kinds(out) == ["PoweredOff"] and (out[0].at, out[0].nodes) == (700, ("node000",))
    assert eng.pool.totals()[2] == (8.0, 64.0, 512.0)  # node000 is cold again
    assert eng.next_timer() is None


def test_idle_node_needed_for_the_reserve_stays_on():
    eng = build_engine(
        nodes=2,
        warm=2,
        warm_headroom={"gpu": 8},
        campaigns=[gpu_campaign("a", 0, 16, 16), gpu_campaign("v", 8, 8, 8)],
    )
    eng.apply(req(0, "a", 8, 100))
    eng.apply(Tick(at=100))
    assert eng.apply(Tick(at=1000)) == []  # 8 reserve + 8 headroom need both nodes
    assert all(n.power.value == "on" for n in eng.pool.nodes)


def test_power_down_keeps_the_reserve_warm():
    eng = build_engine(
        nodes=4,
        warm=3,
        warm_headroom={},
        boot_latency_s=20,
        power_down_idle_s=5,
        campaigns=[gpu_campaign("victim", 16, 16, 16), gpu_campaign("other", 0, 16, 16)],
    )
    eng.apply(req(0, "victim", 8, 10))  # L1 on node000
    eng.apply(req(0, "other", 1, 1000))  # L2: 1 GPU on node001
    out = eng.apply(req(0, "other", 8, 100))  # L3: 7 warm + 1 cold: node003 boots
    assert kinds(out) == ["PoweredOn", "Granted"] and out[0].nodes == ("node003",)
    eng.apply(Release(at=1, lease_id="L3"))  # node003 keeps booting, empty
    eng.apply(Tick(at=10))  # L1 ends: node000 idle, 23 GPUs warm and free, reserve 16
    eng.apply(Tick(at=15))  # node000's power-down check
    assert gpu(eng.pool.totals()[0]) >= gpu(eng.reserve)  # the reserve is still warm
    g = one(eng.apply(req(16, "victim", 16, 60)), Granted)
    assert (g.path, g.starts_at) == (LeasePath.WARM, 16)


def test_polling_next_timer_does_not_change_decisions():
    def run(poll):
        eng = build_engine(
            nodes=2, warm=2, warm_headroom={}, campaigns=[gpu_campaign("a", 0, 16, 16)]
        )
        out = []
        for ev in [
            req(0, "a", 8, 100),  # node000
            Tick(at=100),  # node000 idle: its power-down check is due at 700
            req(200, "a", 8, 1000),  # node000 busy again (the 700 check is now dead)
            Release(at=300, lease_id="L2"),  # idle again: a new check at 900
            Tick(at=800),
            Tick(at=1000),
        ]:
            out.append([codec.encode(d) for d in eng.apply(ev)])
            if poll:
                eng.next_timer()
        return out, eng.state_digest()

    # Without polling the stale 700 check fires (node000 is idle at 700) and powers the
    # node down at 700; with polling it was dropped at t=200 and the node goes at 900.
    assert run(poll=True) == run(poll=False)
