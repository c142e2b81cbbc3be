"""Idempotency keys kept in frozen chunks answer exactly as a plain dict with an exact
window would, before and after a snapshot's round trip."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bursar.broker import keys as keys_module
from bursar.broker import safe_pickle
from bursar.broker.decisions import Rejected
from bursar.broker.events import RequestLease
from bursar.broker.keys import KEY_WINDOW_S, Keys, request_fingerprint
from bursar.broker.reasons import Reason


class Reference:
    """The plain version: a dict by (campaign, key), forgotten exactly at the window."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], dict] = {}
        self.unanswered: dict[str, tuple[str, str]] = {}

    def record(self, c: str, k: str, rid: str, fp: str, now: float) -> None:
        self.records[(c, k)] = {"rid": rid, "fp": fp, "at": now, "answer": None}
        self.unanswered[rid] = (c, k)

    def answer(self, rid: str, d: object) -> None:
        ck = self.unanswered.pop(rid, None)
        if ck is not None and ck in self.records and self.records[ck]["rid"] == rid:
            self.records[ck]["answer"] = d

    def withdraw(self, rid: str) -> None:
        ck = self.unanswered.pop(rid, None)
        if ck is not None and ck in self.records and self.records[ck]["rid"] == rid:
            del self.records[ck]

    def forget(self, now: float) -> None:
        horizon = now - KEY_WINDOW_S
        for ck in [ck for ck, r in self.records.items() if r["at"] <= horizon]:
            rid = self.records.pop(ck)["rid"]
            if self.unanswered.get(rid) == ck:
                del self.unanswered[rid]


ops = st.lists(
    st.tuples(
        st.sampled_from(["record", "record", "answer", "withdraw", "wait", "snapshot"]),
        st.integers(0, 11),  # key
        st.integers(0, 2),  # campaign
        st.floats(0, 0.6 * KEY_WINDOW_S),  # how long to wait
    ),
    max_size=120,
)


_SIX = [("record", i, 0, 0.0) for i in range(6)]
_DAY = ("wait", 0, 0, 0.6 * KEY_WINDOW_S)
_HALF = ("wait", 0, 0, 0.5 * KEY_WINDOW_S)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops)
@example(ops=[*_SIX, ("answer", 0, 0, 0.0)])  # answered after its chunk froze
# Forgotten exactly at the window, and its key taken again before the first is answered.
@example(ops=[("record", 0, 0, 0.0), _HALF, _HALF, ("record", 0, 0, 0.0), ("answer", 0, 0, 0.0)])
@example(ops=[*_SIX, ("withdraw", 1, 0, 0.0), ("snapshot", 0, 0, 0.0)])
@example(ops=[*_SIX, ("withdraw", 1, 0, 0.0), ("record", 1, 0, 0.0), ("snapshot", 0, 0, 0.0)])
@example(
    ops=[*_SIX, _DAY, ("record", 7, 1, 0.0), _DAY, ("record", 0, 0, 0.0), ("snapshot", 0, 0, 0.0)]
)
def test_chunked_keys_answer_as_a_plain_dict(ops: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys_module, "CHUNK", 3)  # the same for every example
    ks, ref = Keys(), Reference()
    now, n = 0.0, 0
    issued: list[str] = []
    for op, k, c, dt in ops:
        campaign, key = f"c{c}", f"k{k}"
        if op == "record":
            if ks.get(campaign, key) is not None:
                continue  # the engine refuses a key in use
            n += 1
            rid = f"L{n}"
            e = RequestLease(now, campaign, {"gpu": float(k + 1)}, 60, idempotency_key=key)
            ks.record(e, rid, now)
            ref.record(campaign, key, rid, request_fingerprint(e), now)
            issued.append(rid)
        elif op in ("answer", "withdraw") and issued:
            rid = issued[(k * 7 + c) % len(issued)]
            if op == "answer":
                d = Rejected(now, rid, campaign, Reason.POOL_FULL, 1.0, {})
                ks.answer(rid, d)
                ref.answer(rid, d)
            else:
                ks.withdraw(rid)
                ref.withdraw(rid)
        elif op == "wait":
            now += dt
        else:
            ks = safe_pickle.loads(pickle.dumps(ks))
        ks.forget(now)
        ref.forget(now)
        got = {
            ck: {"rid": r.request_id, "fp": r.fingerprint, "at": r.at, "answer": r.answer}
            for ck, r in ks.records.items()
        }
        assert got == ref.records
        for ck, r in ref.records.items():
            rec = ks.get(*ck)
            assert rec is not None and rec.request_id == r["rid"] and rec.answer == r["answer"]
        assert all(
            ks.get(f"c{c}", f"k{k}") is None
            for c in range(3)
            for k in range(12)
            if (f"c{c}", f"k{k}") not in ref.records
        )


def test_the_newest_kept_keys_are_held_and_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys_module, "CHUNK", 3)
    ks = Keys(window_s=KEY_WINDOW_S, kept=5)
    for i in range(40):
        e = RequestLease(float(i), "c", {"gpu": 1.0}, 60, idempotency_key=f"k{i}")
        ks.record(e, f"L{i}", float(i))
        ks.forget(float(i))
        # Between the bound and a chunk more; the newest five always answer.
        assert len(ks) < 5 + 3 and (i < 5 or len(ks) >= 5)
        assert all(ks.get("c", f"k{j}") is not None for j in range(max(0, i - 4), i + 1))
    assert ks.get("c", "k0") is None and len(ks.records) == len(ks)
    # The bound and window travel with a snapshot, and a retune takes effect at once.
    back = safe_pickle.loads(pickle.dumps(ks))
    assert (back.window_s, back.kept) == (KEY_WINDOW_S, 5)
    back.retune(10.0, 2)
    back.forget(39.0)
    assert len(back) < 2 + 3 and back.get("c", "k39") is not None
    back.forget(50.0)  # past the window: only the open chunk is left, its keys not answered
    assert back.get("c", "k39") is None and len(back.records) == 0
