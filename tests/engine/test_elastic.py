"""Elastic, deadline-aware leases: one test per rule, decision and reason of the allocator
(``broker/elastic.py`` and the engine's elastic pass). The properties over random
sequences are in ``test_engine_properties.py``."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bursar.broker import dims, elastic
from bursar.broker.decisions import (
    Granted,
    Queued,
    Rejected,
    Released,
    Renewed,
    Resized,
    ResizeWarned,
    Revoked,
)
from bursar.broker.elastic import Decay, DecayKind, DegradeMode, Intent
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import RequestError
from bursar.broker.events import (
    CreateCampaign,
    NodeLost,
    Release,
    Renew,
    RequestLease,
    Tick,
)
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.broker.reasons import Reason

GRACE = 30.0


def engine(
    nodes: int = 4, rule: str = "dmug", bucket: float | None = None, **policy: object
) -> Engine:
    pool = PoolSpec(groups=(NodeGroup(count=nodes, resources={"gpu": 8}, warm=nodes),))
    eng = Engine(
        pool,
        PolicySpec(grace_s=GRACE, power_down_idle_s=None, elastic_rule=rule, **policy),  # type: ignore[arg-type]
    )
    for name in ("a", "b", "c"):
        env = DimEnvelope(guarantee=0, sustained=8 * nodes, burst=8 * nodes, bucket=bucket)
        eng.apply(CreateCampaign(0.0, CampaignSpec(name, {"gpu": env}, LeaseClass.BATCH)))
    return eng


def intent(lo: int = 2, hi: int = 16, work: float = 20_000.0, deadline: float = 3_000.0, **kw):
    return Intent(min={"gpu": lo}, max={"gpu": hi}, remaining_work=work, deadline_s=deadline, **kw)


def amdahl(**kw: object) -> Intent:
    return intent(amdahl=0.05, **kw)  # type: ignore[arg-type]


def size(eng: Engine, lid: str) -> float:
    return eng.elastic_size(lid)[0][0]


def of(out, kind):
    return [d for d in out if isinstance(d, kind)]


def rid(out) -> str:
    own = out.own
    return own.lease_id if isinstance(own, Granted) else own.request_id


def step_to(eng: Engine, t: float) -> list:
    out: list = []
    while (due := eng.next_timer()) is not None and due <= t:
        out += eng.apply(Tick(due))
    out += eng.apply(Tick(t))
    return out


# --------------------------------------------------------------------------- the model


def test_speedup_models():
    it = amdahl()
    assert elastic.speed(it, 1) == pytest.approx(1.0)
    assert elastic.speed(it, 16) == pytest.approx(1 / (0.05 + 0.95 / 16))
    curve = intent(lo=1, hi=8, curve=((1, 10.0), (2, 18.0), (4, 30.0), (8, 40.0)))
    # Measured (the default): known at the points only, the largest at or below.
    assert elastic.speed(curve, 3) == pytest.approx(18.0)
    assert elastic.speed(curve, 7.5) == pytest.approx(30.0)
    assert elastic.speed(curve, 8) == pytest.approx(40.0)
    assert elastic.speed(replace(curve, curve=((2, 18.0), (4, 30.0))), 1) == 0.0
    # Interpolated, when asked for: linear between points.
    lin = replace(curve, speed_model=elastic.INTERPOLATED)
    assert elastic.speed(lin, 3) == pytest.approx(24.0)
    assert elastic.speed(lin, 8) == pytest.approx(40.0)


def test_decay_kinds():
    assert Decay().factor(1.0) == 0.0
    assert Decay(DecayKind.LINEAR, 100.0).factor(25.0) == pytest.approx(0.75)
    assert Decay(DecayKind.EXPONENTIAL, 100.0).factor(200.0) == pytest.approx(0.25)
    assert Decay(DecayKind.LINEAR, 100.0).factor(-5.0) == 1.0


def test_the_default_step_is_one_unit_with_the_rest_in_proportion():
    it = Intent(
        min={"gpu": 2, "cpu": 16},
        max={"gpu": 8, "cpu": 64},
        remaining_work=1,
        deadline_s=1,
        amdahl=0.0,
    )
    assert elastic.resolve_step(it) == {"gpu": 1.0, "cpu": 8.0}


# --------------------------------------------------------------------------- decisions


def test_granted_at_min_then_grown_at_once_from_spare_capacity():
    eng = engine()
    out = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl()))
    (g,) = of(out, Granted)
    assert g.size == {"gpu": 2.0} and g.inputs["elastic"]["mode"] == "full"
    (r,) = of(out, Resized)
    assert r.lease_id == g.lease_id and r.delta == {"gpu": 14.0} and r.size == {"gpu": 16.0}
    assert r.tokens == 0 and r.inputs["units"] == 16.0 and r.inputs["rule"] == "dmug"
    assert size(eng, g.lease_id) == 16.0
    eng.check_invariants()


def test_a_deadline_no_allocation_meets_is_refused_at_once():
    eng = engine()
    out = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl(deadline=100.0)))
    (rej,) = of(out, Rejected)
    assert rej.reason is Reason.DEADLINE_UNREACHABLE
    assert rej.inputs["earliest_finish"]["full"] > rej.inputs["deadline"]
    assert not eng.leases and not eng.pending
    # With admission control off it is served like any other request.
    eng = engine(elastic_admission=False)
    out = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl(deadline=100.0)))
    assert of(out, Granted)


def test_a_deadline_the_admitted_leases_leave_no_room_for_is_refused():
    # Each needs 8 of the pool's 16 GPUs to finish 5 900 s of work by 1 000 s
    # (speed(8) = 5.93, speed(7) = 5.38).
    tight = amdahl(lo=1, hi=16, work=5_900.0, deadline=1_000.0)
    eng = engine(nodes=2)
    assert of(eng.apply(RequestLease(0.0, "a", {}, 3600, intent=tight)), Granted)
    # The second waits for the first's extra steps to come back; it counts all the same.
    assert of(eng.apply(RequestLease(0.0, "b", {}, 3600, intent=tight)), Queued)
    # A third with the same deadline: alone it needs 1 GPU, but no plan fits its 100 s of
    # work before 1 000 s beside theirs (they need the pool to about 996 s). The plan
    # (earliest deadline first, ties to the older) binds on its own deadline.
    third = amdahl(lo=1, hi=16, work=100.0, deadline=1_000.0)
    out = eng.apply(RequestLease(0.0, "c", {}, 3600, intent=third))
    (rej,) = of(out, Rejected)
    assert rej.reason is Reason.DEADLINE_UNREACHABLE
    assert rej.inputs["plan"] == {
        "binding": rej.request_id,
        "binding_deadline": 1_000.0,
        "needed": 1.0,
        "capacity": 16.0,
    }
    # Without admission control it is served, and the pool is shared among the three.
    eng = engine(nodes=2, elastic_admission=False)
    for name in ("a", "b"):
        eng.apply(RequestLease(0.0, name, {}, 3600, intent=tight))
    out = eng.apply(RequestLease(0.0, "c", {}, 3600, intent=third))
    assert not of(out, Rejected)


def test_admission_looks_at_the_fastest_allocation_not_at_max():
    # A measured curve that slows down past 8 GPUs: 5 000 iterations take 83 s on 8
    # GPUs but 167 s on 64; a 100 s deadline is met, at 8, and the lease grows no further.
    curve = ((1, 10.0), (2, 19.0), (4, 35.0), (8, 60.0), (16, 50.0), (32, 40.0))
    it = intent(lo=1, hi=32, work=5_000.0, deadline=100.0, curve=curve)
    assert elastic.fastest_units(it) == 8.0
    eng = engine()
    out = eng.apply(RequestLease(0.0, "a", {}, 600, intent=it))
    (g,) = of(out, Granted)
    assert size(eng, g.lease_id) == 8.0


def test_a_value_left_past_the_deadline_is_not_refused():
    eng = engine()
    late = amdahl(deadline=100.0, decay=Decay(DecayKind.LINEAR, 10_000.0))
    assert of(eng.apply(RequestLease(1.0, "a", {}, 3600, intent=late)), Granted)


def test_a_degrade_mode_is_picked_when_the_deadline_is_otherwise_lost():
    eng = engine()
    # Full: 20 000 s of work at speed(16) = 9.1 takes 2 188 s; fp16 halves the work.
    it = amdahl(deadline=1_500.0, degrade=(DegradeMode("fp16", 0.5, 0.8),))
    out = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=it))
    (g,) = of(out, Granted)
    assert g.inputs["elastic"]["mode"] == "fp16"
    assert eng.elastic.by_lease[g.lease_id].work_left == pytest.approx(10_000.0)
    # Without degrade modes allowed, the same request is hopeless.
    eng = engine(elastic_degrade=False)
    out = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=it))
    assert of(out, Rejected)[0].reason is Reason.DEADLINE_UNREACHABLE


def test_a_waiting_request_gets_the_extra_steps_back_after_a_warning_and_the_grace():
    eng = engine()
    lid = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl(hi=32))).own.lease_id
    assert size(eng, lid) == 32.0
    out = eng.apply(RequestLease(2.0, "b", {"gpu": 8}, 600))
    (q,) = of(out, Queued)
    (w,) = of(out, ResizeWarned)
    assert w.lease_id == lid and w.for_request == q.request_id
    assert w.deadline == 2.0 + GRACE and w.to == {"gpu": 24.0} and w.inputs["why"] == "request"
    assert size(eng, lid) == 32.0  # nothing taken before the deadline
    out = step_to(eng, 2.0 + GRACE)
    (r,) = of(out, Resized)
    assert r.delta == {"gpu": -8.0} and r.at == 2.0 + GRACE and r.inputs["cause"] == "resized"
    assert r.tokens == 0 and r.credits < 0  # refunded
    (g,) = of(out, Granted)
    assert g.lease_id == q.request_id
    eng.check_invariants()


def test_a_step_moves_to_the_lease_it_is_worth_more_to():
    eng = engine(nodes=2)
    slack = amdahl(hi=16, work=2_000.0, deadline=80_000.0)  # plenty of time
    a = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=slack)).own.lease_id
    assert size(eng, a) == 16.0
    # An urgent job that needs about 8 GPUs to make its deadline arrives to a full pool.
    urgent = amdahl(lo=1, hi=8, work=4_000.0, deadline=900.0)
    b = rid(eng.apply(RequestLease(2.0, "b", {}, 3600, intent=urgent)))
    # Its min comes back a grace period on; then the steps it is worth more to, one more on.
    out = step_to(eng, 2.0 + 2 * GRACE + 1)
    moved = [d for d in out if isinstance(d, ResizeWarned) and d.inputs["why"] == f"to {b}"]
    assert moved and moved[0].lease_id == a
    assert b in eng.leases
    assert size(eng, b) > 1.0 and size(eng, a) < 16.0
    assert size(eng, a) + size(eng, b) <= 16.0
    eng.check_invariants()


# A step curve: measured at 1, 2, 4 and 8 GPUs; 3 GPUs run at 2-GPU speed.
STEPS = ((1.0, 10.0), (2.0, 18.0), (4.0, 34.0), (8.0, 40.0))


def test_a_lease_crosses_a_plateau_of_its_measured_curve():
    eng = engine(nodes=1)
    out = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=intent(lo=1, hi=8, curve=STEPS)))
    # From 2, the step to 3 gains nothing: the jump to 4 pays, then the one to 8.
    assert size(eng, out.own.lease_id) == 8.0
    (r,) = of(out, Resized)
    assert r.size == {"gpu": 8.0}
    eng.check_invariants()


POW2 = intent(lo=1, hi=8, curve=STEPS, size_rule="powers_of_two")


def test_a_jump_is_granted_one_extent_per_allowed_size_crossed():
    eng = engine(nodes=1)
    lid = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=POW2))
    el = eng.elastic.by_lease[lid.own.lease_id]
    # 1 -> 8 GPUs crosses the allowed sizes 2, 4 and 8: three extents of 1, 2 and 4 GPUs.
    assert [el.counts[x] for x in el.extents] == [1, 2, 4] and el.steps == 7
    assert [eng.leases[x].size[0] for x in el.extents] == [1.0, 2.0, 4.0]
    eng.check_invariants()


def test_a_shrink_to_the_next_allowed_size_ends_the_youngest_extent():
    eng = engine(nodes=1)
    lid = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=POW2))
    lid = lid.own.lease_id
    youngest = eng.elastic.by_lease[lid].extents[-1]
    out = eng.apply(RequestLease(2.0, "b", {"gpu": 3}, 600))
    (w,) = of(out, ResizeWarned)
    assert w.to == {"gpu": 4.0} and eng.elastic.by_lease[lid].warned == {youngest: 2.0 + GRACE}
    out = step_to(eng, 2.0 + GRACE)
    (r,) = of(out, Resized)
    assert r.delta == {"gpu": -4.0} and youngest not in eng.leases
    assert [eng.elastic.by_lease[lid].counts[x] for x in eng.elastic.by_lease[lid].extents] == [
        1,
        2,
    ]
    eng.check_invariants()


def test_a_lost_node_under_older_extents_takes_the_younger_ones_that_no_longer_add_up():
    # b holds 7 of node 0's 8 GPUs; a's lease (1 GPU) takes the last. Its extents of 1, 2
    # and 4 steps go to node 1, the one of 8 steps to node 2 (sizes 2, 4, 8 and 16).
    eng = engine(nodes=3)
    eng.apply(RequestLease(1.0, "b", {"gpu": 7}, 3600))
    pow2 = amdahl(lo=1, hi=16, size_rule="powers_of_two", deadline=9_000.0)
    lid = eng.apply(RequestLease(2.0, "a", {}, 3600, intent=pow2)).own.lease_id
    el = eng.elastic.by_lease[lid]
    assert [el.counts[x] for x in el.extents] == [1, 2, 4, 8]
    nodes = [sorted(eng.leases[x].pieces) for x in el.extents]
    assert nodes[:3] == [[1], [1], [1]] and nodes[3] == [2]
    lost = eng.pool.nodes[1].name
    out = eng.apply(NodeLost(5.0, lost))
    # The 8 left beside min would make 9 GPUs, no power of two: that extent goes as well,
    # at once; the pass then grows the lease again on what is left (node 2's 8 GPUs).
    shrink, regrow = of(out, Resized)
    assert shrink.delta == {"gpu": -15.0} and shrink.size == {"gpu": 1.0}
    assert shrink.inputs["cause"] == f"node {lost} lost"
    assert regrow.size == {"gpu": 8.0} and size(eng, lid) == 8.0
    assert not of(out, Revoked)
    eng.check_invariants()


def test_the_extents_a_lease_keeps_make_an_allowed_size_at_each_one():
    el = elastic.ElasticLease(
        "L1", "a", 1, intent(lo=1, hi=8, curve=STEPS, size_rule="powers_of_two"),
        dims.vec({"gpu": 1.0}), 0, 1e6, 1.0,
    )  # fmt: skip
    el.counts = {"x1": 1, "x2": 2, "x4": 4}
    assert el.allowed == (0, 1, 3, 7)
    assert el.kept(["x1", "x2", "x4"], 7) == 3 and el.kept(["x1", "x2", "x4"], 6) == 2
    # Without the 2-step extent, 1 + 4 = 5 steps is no allowed size: only the first stays.
    assert el.kept(["x1", "x4"], el.floor(5)) == 1
    assert el.youngest(["x1", "x2", "x4"], 5) == ["x4", "x2"]


def test_the_jump_is_the_best_gain_per_step_ties_to_the_smaller():
    el = elastic.ElasticLease(
        "L1", "a", 1, intent(lo=1, hi=8, curve=STEPS), dims.vec({"gpu": 1.0}), 0, 1e6, 1.0,
        work_left=1000.0,
    )  # fmt: skip
    # From 1 GPU: to 2 gains 0.8 per step, to 4 also 0.8 (2.4 over 3 steps): the smaller.
    (g2, a2), (g4, a4), *_ = el.jumps(0.0, False, 0)
    assert (a2, a4) == (1, 3) and g2 == pytest.approx(0.8) and g4 == pytest.approx(0.8)
    # From 2: the plateau at 3 is no candidate; 4 beats everything above it per step.
    jumps = [a for _, a in el.jumps(0.0, False, 1)]
    assert jumps[0] == 3 and 2 not in jumps
    assert el.targets("edf", 0.0) == [1]
    el.extents, el.counts, el.held_steps = ["x"], {"x": 1}, 1
    assert el.targets("edf", 0.0) == [3]  # past the plateau, not 3 GPUs
    # Every size allowed: a shrink from 4 to 3 gives up all that 4 adds over 3 (= over 2).
    assert el.down(3) == 2 and el.worth(0.0, False, 3) == pytest.approx(16 / 18)


def test_a_lease_holds_only_the_sizes_its_intent_allows():
    eng = engine(nodes=2)
    pow2 = amdahl(lo=1, hi=12, size_rule="powers_of_two", deadline=9_000.0)
    lid = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=pow2)).own.lease_id
    assert size(eng, lid) == 8.0  # 12 is no power of two: 8 is its largest size
    # A 4-GPU request needs 4 of the 8 free: the lease is not asked to shrink.
    eng.apply(RequestLease(2.0, "b", {"gpu": 4}, 600))
    # 10 more GPUs wanted with 4 free: the lease is warned down a jump, to 4 (not to 2 or 6).
    out = eng.apply(RequestLease(3.0, "c", {"gpu": 8}, 600))
    (w,) = of(out, ResizeWarned)
    assert w.to == {"gpu": 4.0}
    for d in step_to(eng, 3.0 + GRACE):
        if isinstance(d, Resized):
            assert d.size["gpu"] in (1.0, 2.0, 4.0, 8.0)
    assert size(eng, lid) == 4.0
    eng.check_invariants()


def test_sizes_as_a_list_and_as_divisors_of_the_batch():
    listed = amdahl(lo=1, hi=16, sizes=(1.0, 3.0, 6.0, 12.0))
    assert elastic.allowed_units(listed) == (1.0, 3.0, 6.0, 12.0)
    divisors = amdahl(lo=1, hi=16, size_rule="divisors_of:24")
    assert elastic.allowed_units(divisors) == (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
    eng = engine(nodes=2)
    lid = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=divisors)).own.lease_id
    assert size(eng, lid) == 12.0


def test_an_admitted_deadline_lease_is_renewed_past_a_reservation():
    eng = engine(nodes=1)
    it = amdahl(lo=1, hi=4, sizes=(1.0, 4.0), work=10_000.0, deadline=20_000.0)
    lid = eng.apply(RequestLease(1.0, "a", {}, 600, intent=it)).own.lease_id
    # A request for the whole node waits: its reservation needs the lease's GPUs back.
    eng.apply(RequestLease(2.0, "b", {"gpu": 8}, 600))
    out = eng.apply(Renew(500.0, lid, 600))
    (r,) = of(out, Renewed)
    assert r.inputs["deadline_promise"] == 1.0 + 20_000.0
    # A plain lease (no deadline promised) in the same place is refused.
    eng2 = engine(nodes=1)
    plain = eng2.apply(RequestLease(1.0, "a", {"gpu": 1}, 600)).own.lease_id
    eng2.apply(RequestLease(2.0, "b", {"gpu": 8}, 600))
    (rej,) = of(eng2.apply(Renew(500.0, plain, 600)), Rejected)
    assert rej.reason is Reason.HEAD_OF_LINE and rej.request_id == plain


def test_edf_grows_the_earliest_deadline_first():
    eng = engine(nodes=2, rule="edf", elastic_admission=False)
    late = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl(lo=1, hi=16, deadline=9e4)))
    assert size(eng, late.own.lease_id) == 16.0
    # The earlier deadline takes steps back from the later one, a grace period on.
    lid = rid(eng.apply(RequestLease(2.0, "b", {}, 3600, intent=amdahl(lo=1, hi=16, deadline=5e3))))
    step_to(eng, 2.0 + 2 * GRACE + 1)
    assert size(eng, lid) > size(eng, late.own.lease_id)


def test_proportional_shares_the_spare_steps_evenly():
    eng = engine(nodes=2, rule="proportional", elastic_admission=False)
    a = rid(eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl(lo=1, hi=16, deadline=9e4))))
    b = rid(eng.apply(RequestLease(1.0, "b", {}, 3600, intent=amdahl(lo=1, hi=16, deadline=9e4))))
    step_to(eng, 1.0 + 3 * GRACE)
    sa, sb = size(eng, a), size(eng, b)
    assert sa + sb == 16.0 and abs(sa - sb) <= 1.0


def test_steps_renew_with_their_lease_and_end_with_it():
    eng = engine()
    lid = eng.apply(RequestLease(1.0, "a", {}, 600, intent=amdahl())).own.lease_id
    steps = list(eng.elastic.by_lease[lid].extents)
    out = eng.apply(Renew(100.0, lid, 1_200))
    assert all(eng.leases[x].expires_at == eng.leases[lid].expires_at for x in steps)
    out = eng.apply(Release(200.0, lid))
    (rel,) = of(out, Released)
    # The refund covers the steps too: 16 GPUs for the rest of their prepaid time.
    assert rel.refund_credits > 0
    assert not eng.leases and not eng.elastic.by_lease and not eng.elastic.parent_of
    eng.check_invariants()


def test_a_step_announced_to_end_lives_until_then_when_its_lease_is_renewed():
    # The steps are announced at 590 to end at 620 (for b); the lease is renewed at 595.
    # The steps end at 620 as announced, not at the lease's old expiry (601), unannounced.
    eng = engine(nodes=2)
    lid = eng.apply(RequestLease(1.0, "a", {}, 600, intent=amdahl())).own.lease_id
    assert size(eng, lid) == 16.0 and eng.leases[lid].expires_at == 601.0
    (w,) = of(eng.apply(RequestLease(590.0, "b", {"gpu": 8}, 100)), ResizeWarned)
    assert w.deadline == 620.0
    assert eng.apply(Renew(595.0, lid, 600)).own.expires_at == 1195.0
    assert not of(step_to(eng, 619.0), Resized) and size(eng, lid) == 16.0
    out = step_to(eng, 620.0)
    (r,) = of(out, Resized)
    assert (r.at, r.delta["gpu"], r.inputs["cause"]) == (620.0, -8.0, "resized")
    assert of(out, Granted)[0].campaign == "b" and size(eng, lid) == 8.0
    eng.check_invariants()


def test_a_step_its_bucket_cannot_renew_is_announced_to_end_at_its_prepaid_end():
    # Sustained 2, a bucket of 40 000 GPU-s: 14 extra GPUs for 600 s prepay 8 400.
    pool = PoolSpec(groups=(NodeGroup(count=2, resources={"gpu": 8}, warm=2),))
    eng = Engine(pool, PolicySpec(grace_s=GRACE, power_down_idle_s=None))
    env = DimEnvelope(guarantee=0, sustained=2, burst=16, bucket=12_000)
    eng.apply(CreateCampaign(0.0, CampaignSpec("a", {"gpu": env}, LeaseClass.BATCH)))
    lid = eng.apply(RequestLease(1.0, "a", {}, 600, intent=amdahl())).own.lease_id
    grown = size(eng, lid)
    assert grown > 2.0
    out = eng.apply(Renew(500.0, lid, 600))
    (w,) = of(out, ResizeWarned)
    assert w.inputs["why"] == "bucket" and w.deadline == 601.0
    out = step_to(eng, 601.0)
    assert of(out, Resized)[0].delta["gpu"] < 0 and lid in eng.leases
    eng.check_invariants()


def test_a_lost_node_under_a_step_shrinks_the_lease_at_once():
    eng = engine(nodes=2)
    lid = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl(hi=16))).own.lease_id
    own = sorted(eng.leases[lid].pieces)
    other = next(n for n in eng.pool.nodes if eng.pool.index[n.name] not in own)
    out = eng.apply(NodeLost(5.0, other.name))
    shrinks = of(out, Resized)
    assert all(r.inputs["cause"] == f"node {other.name} lost" for r in shrinks)
    assert sum(r.delta["gpu"] for r in shrinks) == -8.0 and size(eng, lid) == 8.0
    assert not of(out, Revoked)  # the lease itself lives on
    eng.check_invariants()


def test_progress_follows_the_units_held():
    eng = engine()
    lid = eng.apply(
        RequestLease(0.0, "a", {}, 3600, intent=amdahl(hi=2, work=2_000.0))
    ).own.lease_id
    step_to(eng, 100.0)
    el = eng.elastic.by_lease[lid]
    assert el.work_left == pytest.approx(2_000.0 - 100.0 * elastic.speed(el.intent, 2))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("intent_", "field"),
    [
        (intent(hi=1), "intent.max.gpu"),
        (
            Intent(min={"gpu": 2}, max={"cpu": 4}, remaining_work=1, deadline_s=1, amdahl=0),
            "intent.max",
        ),
        (intent(amdahl=1.5), "intent.speedup.amdahl_serial_fraction"),
        (intent(), "intent.speedup"),
        (intent(lo=1, hi=8, curve=((2, 1.0), (8, 4.0))), "intent.speedup.curve"),
        (intent(lo=1, hi=8, curve=((1, 1.0), (1, 4.0), (8, 5.0))), "intent.speedup.curve"),
        (amdahl(work=0.0), "intent.remaining_work"),
        (amdahl(deadline=-1.0), "intent.deadline_s"),
        (amdahl(value=math.nan), "intent.value"),
        (amdahl(decay=Decay(DecayKind.LINEAR, 0.0)), "intent.decay.window_s"),
        (amdahl(degrade=(DegradeMode("full", 0.5, 1.0),)), "intent.degrade[0].name"),
        (amdahl(degrade=(DegradeMode("x", 0.0, 1.0),)), "intent.degrade[0].work_factor"),
        (amdahl(degrade=(DegradeMode("x", 0.5, 2.0),)), "intent.degrade[0].value_factor"),
        (amdahl(hi=64), "intent.max.gpu"),
        (amdahl(speed_model="linear"), "intent.speed_model"),
        (amdahl(size_rule="odd"), "intent.size_rule"),
        (amdahl(size_rule="divisors_of:x"), "intent.size_rule"),
        (amdahl(sizes=(4.0, 8.0)), "intent.min"),
        (amdahl(lo=3, size_rule="powers_of_two"), "intent.min"),
        (amdahl(sizes=()), "intent.sizes"),
        (
            Intent(
                min={"gpu": 2},
                max={"gpu": 7},
                step={"gpu": 2},
                remaining_work=1,
                deadline_s=1,
                amdahl=0,
            ),
            "intent.max",
        ),
    ],
)
def test_bad_intents_are_refused_naming_the_field_and_change_nothing(intent_, field):
    eng = engine()
    before = eng.state_digest()
    with pytest.raises(RequestError) as err:
        eng.apply(RequestLease(1.0, "a", {}, 600, intent=intent_))
    assert err.value.field == field, err.value
    assert eng.state_digest() == before


def test_a_size_beside_an_intent_must_be_its_min_and_steps_are_not_leases():
    eng = engine()
    with pytest.raises(RequestError) as err:
        eng.apply(RequestLease(1.0, "a", {"gpu": 4}, 600, intent=amdahl()))
    assert err.value.field == "size"
    lid = eng.apply(RequestLease(1.0, "a", {"gpu": 2}, 600, intent=amdahl())).own.lease_id
    step = eng.elastic.by_lease[lid].extents[0]
    with pytest.raises(RequestError) as err:
        eng.apply(Release(2.0, step))
    assert lid in str(err.value)


def test_a_preemptible_campaign_cannot_be_elastic():
    eng = engine()
    env = DimEnvelope(guarantee=0, sustained=8, burst=32, bucket=None)
    eng.apply(CreateCampaign(0.0, CampaignSpec("bf", {"gpu": env}, LeaseClass.OPPORTUNISTIC, True)))
    with pytest.raises(RequestError) as err:
        eng.apply(RequestLease(1.0, "bf", {}, 600, intent=amdahl()))
    assert err.value.field == "intent"
