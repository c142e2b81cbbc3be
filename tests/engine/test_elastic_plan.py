"""Elastic admission control plans over time (``elastic.plan``, ``elastic.admission_plan``
and the engine's use of them): a deadline job is admitted when a plan keeps its deadline
and every admitted job's, refused otherwise with the binding deadline named."""

from __future__ import annotations

import bisect
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from test_elastic import GRACE, amdahl, engine, of, rid, size, step_to

from bursar.broker import elastic
from bursar.broker.decisions import Granted, Queued, Rejected, ResizeWarned
from bursar.broker.elastic import PlanJob
from bursar.broker.events import RequestLease
from bursar.broker.reasons import Reason


def job(key: str, deadline: float, work: float, sizes=(1, 2, 4, 8), order: int = 0) -> PlanJob:
    """A job whose speed is its size (linear scaling), on the given sizes."""
    return PlanJob(key, deadline, work, tuple(map(float, sizes)), tuple(map(float, sizes)), order)


def test_a_job_that_fits_only_once_an_earlier_deadline_is_met_is_planned_after_it() -> None:
    # 8 units. A needs all 8 for 100 s; B needs 4 units for 200 s by 300 s: held side by
    # side from now they need 12, but B fits in the 200 s after A is done.
    a = job("A", 100.0, 800.0, order=1)
    b = job("B", 300.0, 800.0, order=2)
    assert elastic.constant_need(a, 0.0) == 8.0 and elastic.constant_need(b, 0.0) == 4.0
    assert elastic.admission_plan([a], b, 8.0, 0.0) is None
    shares, failed = elastic.plan([a, b], 8.0, 0.0)
    assert not failed
    assert shares["A"] == (elastic.Piece(0.0, 100.0, 8.0),)
    assert shares["B"] == (elastic.Piece(100.0, 300.0, 4.0),)


def test_a_job_that_would_make_an_admitted_deadline_miss_names_that_deadline() -> None:
    # The newcomer's deadline comes first, so it is planned first and A, behind it, misses.
    a = job("A", 200.0, 1_400.0, order=1)  # 8 units for 175 s of its 200 s
    new = job("N", 100.0, 400.0, order=2)  # 4 units for 100 s
    assert elastic.admission_plan([a], new, 8.0, 0.0) == "A"
    # A newcomer no plan saves names its own deadline.
    late = job("M", 300.0, 3_000.0, order=3)
    assert elastic.admission_plan([a], late, 8.0, 0.0) == "M"
    # An admitted job that fell behind (no plan saves it, newcomer or not) binds nothing:
    # it keeps its smallest size to its deadline and the newcomer is planned beside it.
    behind = job("B", 50.0, 1_000.0, order=0)
    assert elastic.admission_plan([behind], job("N", 100.0, 350.0), 8.0, 0.0) is None
    assert elastic.admission_plan([behind], job("N", 100.0, 650.0), 8.0, 0.0) == "N"


def test_the_plan_runs_on_allowed_sizes_and_catches_up_where_fewer_are_free() -> None:
    # Powers of two on 6 units: with 4 taken for 100 s, B (cap 4) runs on 2 there, then 4.
    a = job("A", 100.0, 400.0, sizes=(4,), order=1)
    b = job("B", 250.0, 800.0, sizes=(1, 2, 4), order=2)
    shares, failed = elastic.plan([a, b], 6.0, 0.0)
    assert not failed
    assert shares["B"] == (elastic.Piece(0.0, 100.0, 2.0), elastic.Piece(100.0, 250.0, 4.0))


def test_the_engine_admits_a_request_that_fits_after_the_admitted_deadlines() -> None:
    # Each of a and b needs 8 of the pool's 16 GPUs to finish 5 900 s of work by 1 000 s;
    # held side by side from now c's one more GPU does not fit, but c's 100 s of work fits
    # after them, by its 3 000 s deadline.
    tight = amdahl(lo=1, hi=16, work=5_900.0, deadline=1_000.0)
    eng = engine(nodes=2)
    assert of(eng.apply(RequestLease(0.0, "a", {}, 3600, intent=tight)), Granted)
    queued = eng.apply(RequestLease(0.0, "b", {}, 3600, intent=tight))
    assert of(queued, Queued)
    out = eng.apply(RequestLease(0.0, "c", {}, 3600, intent=amdahl(lo=1, hi=16, work=100.0)))
    assert not of(out, Rejected)
    # One whose deadline comes before theirs would make one of them miss: refused, and the
    # refusal names the one (the later of the two, planned after the newcomer).
    early = amdahl(lo=1, hi=16, work=300.0, deadline=500.0)
    (rej,) = of(eng.apply(RequestLease(0.0, "c", {}, 3600, intent=early)), Rejected)
    assert rej.reason is Reason.DEADLINE_UNREACHABLE
    plan = rej.inputs["plan"]
    assert plan["binding"] == rid(queued) and plan["binding_deadline"] == 1_000.0
    assert plan["capacity"] == 16.0


@st.composite
def jobs(draw: st.DrawFn) -> tuple[list[PlanJob], float]:
    capacity = float(draw(st.integers(1, 32)))
    out = []
    for i in range(draw(st.integers(1, 8))):
        sizes = sorted(set(draw(st.lists(st.integers(1, 16), min_size=1, max_size=5))))
        # Speeds rising with a plateau or a fall now and then (measured curves do both).
        speeds = [float(draw(st.integers(0, 20))) for _ in sizes]
        out.append(
            PlanJob(
                f"J{i}",
                float(draw(st.integers(1, 500))),
                float(draw(st.integers(0, 4_000))),
                tuple(map(float, sizes)),
                tuple(speeds),
                i,
            )
        )
    return out, capacity


@settings(max_examples=300, deadline=None)
@given(case=jobs())
def test_every_planned_job_meets_its_deadline_within_the_capacity(
    case: tuple[list[PlanJob], float],
) -> None:
    js, capacity = case
    shares, failed = elastic.plan(js, capacity, 0.0)
    assert set(shares) | set(failed) == {j.key for j in js} and not set(shares) & set(failed)
    edges: set[float] = {0.0}
    for j in js:
        if j.key not in shares:
            continue
        done = 0.0
        for p in shares[j.key]:
            assert 0.0 <= p.start < p.end <= j.deadline + 1e-6
            assert p.units in j.sizes
            done += (p.end - p.start) * j.speeds[j.sizes.index(p.units)]
            edges |= {p.start, p.end}
        assert done >= j.work * (1 - 1e-9) - 1e-6
    # At no time does the plan hand out more than the capacity.
    for t in sorted(edges):
        used = sum(p.units for ps in shares.values() for p in ps if p.start <= t < p.end)
        assert used <= capacity + 1e-9
    # A job that fails alone is one that no allowed size within the capacity saves.
    for j in js:
        _, lost = elastic.plan([j], capacity, 0.0)
        fits = [
            s * j.deadline >= j.work
            for u, s in zip(j.sizes, j.speeds, strict=True)
            if u <= capacity
        ]
        assert bool(lost) == (j.work > 0 and not any(fits))


@settings(max_examples=200, deadline=None)
@given(case=jobs())
def test_admission_admits_only_what_a_plan_keeps(case: tuple[list[PlanJob], float]) -> None:
    js, capacity = case
    *admitted, new = js
    binding = elastic.admission_plan(admitted, new, capacity, 0.0)
    _, behind = elastic.plan(admitted, capacity, 0.0)
    kept = [j for j in admitted if j.key not in behind]
    held = tuple((j.sizes[0], j.deadline) for j in admitted if j.key in behind)
    _, failed = elastic.plan([*kept, new], capacity, 0.0, held)
    if binding is None:
        # Admitted: a plan keeps the newcomer's deadline and every kept one's.
        assert not failed
    else:
        assert binding == failed[0]
        assert binding in {j.key for j in [*kept, new]}


def test_under_dmug_a_burst_of_waiting_requests_is_made_room_for_in_one_grace_period() -> None:
    # One lease holds the whole pool; two requests of 8 (one campaign) arrive a second apart. Under dmug
    # the second's steps are announced at once (both are served after one grace period);
    # under edf it waits for the first to be served before its own are announced.
    for rule, announced in (("dmug", True), ("edf", False)):
        eng = engine(rule=rule)
        lid = eng.apply(RequestLease(1.0, "a", {}, 3600, intent=amdahl(hi=32))).own.lease_id
        first = eng.apply(RequestLease(2.0, "b", {"gpu": 8}, 600))
        assert [w.lease_id for w in of(first, ResizeWarned)] == [lid]
        second = eng.apply(RequestLease(3.0, "b", {"gpu": 8}, 600))
        assert bool(of(second, ResizeWarned)) is announced, rule
        out = step_to(eng, 3.0 + GRACE)
        granted = {g.lease_id for g in of(out, Granted)}
        assert (rid(second) in granted) is announced, rule
        eng.check_invariants()


def test_under_dmug_a_lost_deadline_takes_steps_while_another_move_is_in_flight() -> None:
    # Two urgent jobs (each lost at 1 GPU, met at 8) arrive to a pool one slack lease holds.
    # The first's move is announced as soon as it runs; the second's is announced while the
    # first's is still in flight, not a grace period later.
    eng = engine(nodes=2)
    a = eng.apply(
        RequestLease(1.0, "a", {}, 3600, intent=amdahl(hi=16, work=2_000.0, deadline=80_000.0))
    ).own.lease_id
    urgent = amdahl(lo=1, hi=8, work=4_000.0, deadline=900.0)
    b = rid(eng.apply(RequestLease(2.0, "b", {}, 3600, intent=urgent)))
    c = rid(eng.apply(RequestLease(2.5, "b", {}, 3600, intent=urgent)))
    out = step_to(eng, 2.5 + GRACE + 1)
    moves = {d.inputs["why"]: d for d in of(out, ResizeWarned) if d.inputs["why"] != "request"}
    assert set(moves) == {f"to {b}", f"to {c}"}
    assert all(d.lease_id == a for d in moves.values())
    assert moves[f"to {c}"].at < moves[f"to {b}"].deadline  # while the first is in flight
    # Both are saved: once the steps come back each holds a size that meets its deadline.
    step_to(eng, 2.5 + 2 * GRACE + 1)
    for lid in (b, c):
        e = eng.elastic.by_lease[lid]
        assert size(eng, lid) > 1.0 and e.rescue(eng.now) is None
        assert eng.now + e.time_left() <= e.deadline
    eng.check_invariants()


def _fill_piece_by_piece(job, free, best_u, best_s, cap):  # type: ignore[no-untyped-def]
    """``elastic._fill`` as it was first written: a piece per piece of time (runs at one
    size not joined). The reference for the joined runs below."""
    done = 0.0
    out = []
    ts, fr = free.ts, free.free
    for i, t0 in enumerate(ts):
        if t0 >= job.deadline:
            break
        t1 = min(ts[i + 1] if i + 1 < len(ts) else math.inf, job.deadline)
        room = min(job.sizes[cap], fr[i])
        k = bisect.bisect_right(job.sizes, room + 1e-9) - 1
        if k < 0 or best_s[min(k, cap)] <= 0:
            continue
        u, sp = best_u[min(k, cap)], best_s[min(k, cap)]
        end = t0 + (job.work - done) / sp
        if end <= t1 + 1e-9:
            out.append(elastic.Piece(t0, min(end, t1), u))
            return out
        done += (t1 - t0) * sp
        out.append(elastic.Piece(t0, t1, u))
    return None


@settings(max_examples=300, deadline=None)
@given(case=jobs(), now=st.sampled_from([0.0, 10.0, 100.0]))
def test_runs_at_one_size_plan_as_pieces_of_time_do(
    case: tuple[list[PlanJob], float], now: float
) -> None:
    """Joining a job's consecutive pieces at one size into one run changes no answer and
    leaves the same units free over time: the same jobs planned and failed, each run the
    union of the reference's pieces, the profile after every share the same."""
    js, capacity = case
    *admitted, new = js

    def run(fill):  # type: ignore[no-untyped-def]
        saved = elastic._fill
        elastic._fill = fill
        try:
            free = elastic._held_free(now, capacity, ())
            shares = []
            for j in sorted(js, key=elastic._order):
                shares.append(elastic._share(j, free, now))
            return (
                shares,
                (free.ts, free.free),
                elastic.admission_plan(admitted, new, capacity, now),
            )
        finally:
            elastic._fill = saved

    joined, free_joined, answer_joined = run(elastic._fill)
    pieces, free_pieces, answer_pieces = run(_fill_piece_by_piece)
    assert answer_joined == answer_pieces
    assert free_joined == free_pieces
    for a, b in zip(joined, pieces, strict=True):
        assert (a is None) == (b is None)
        if a is None or b is None:
            continue
        # Each run covers consecutive reference pieces of its size, end to end.
        it = iter(b)
        for r in a:
            p = next(it)
            assert (p.start, p.units) == (r.start, r.units)
            while p.end != r.end:
                q = next(it)
                assert q.start == p.end and q.units == r.units
                p = q
        assert next(it, None) is None
