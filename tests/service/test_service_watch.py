"""The Watch hub on its own: a real runtime and journal, the hub publishing what the
runtime's listener hears. A stream opens with a snapshot or a replay from the journal,
and a replay sends the events a stream that was open live was sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_support import START, config, run

from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import Release, Renew, RequestLease
from bursar.broker.runtime import Runtime
from bursar.broker.service.errors import StreamOverflow
from bursar.broker.service.watch import STREAM_BACKLOG, Subscription, WatchHub
from bursar.protos.bursar.v1 import broker_pb2 as pb

K = pb.LeaseEventKind


class Broker:
    def __init__(self, state: Path) -> None:
        self.rt = Runtime.open(state, config(), at=START)
        self.t = START
        self.hub = WatchHub(self.rt, lambda: self.t)

        def publish(_event: object, outcome: object) -> None:
            for index, d in enumerate(outcome.decisions):  # type: ignore[attr-defined]
                self.hub.publish(d, outcome.seq, index)  # type: ignore[attr-defined]

        self.rt.listen(publish)

    def at(self) -> float:
        self.t += 1.0
        return self.t

    def grant(self, campaign: str = "sci") -> tuple[str, int]:
        out = self.rt.submit(RequestLease(self.at(), campaign, {"gpu": 1}, 600))
        return out.own.lease_id, out.seq  # type: ignore[union-attr]

    def renew(self, lease_id: str) -> None:
        self.rt.submit(Renew(at=self.at(), lease_id=lease_id, duration_s=600))

    def release(self, lease_id: str) -> None:
        self.rt.submit(Release(at=self.at(), lease_id=lease_id))


@pytest.fixture
def broker(tmp_path: Path):
    b = Broker(tmp_path)
    yield b
    b.rt.close()


def _drain(sub: Subscription) -> list[pb.LeaseEvent]:
    async def go() -> list[pb.LeaseEvent]:
        out = []
        while (ev := await sub.next()) is not None:
            out.append(ev)
        return out

    return run(go())


def test_a_stream_opens_with_a_snapshot_then_follows_until_its_leases_end(
    broker: Broker,
) -> None:
    live, _ = broker.grant()
    gone, _ = broker.grant()
    broker.release(gone)
    sub = broker.hub.open("sci", [live, gone], holder="sci")
    kinds = [(ev.kind, ev.lease.lease_id, ev.snapshot) for ev in sub.snapshot]
    assert kinds == [
        (K.LEASE_EVENT_KIND_ACTIVATED, live, True),
        (K.LEASE_EVENT_KIND_RELEASED, gone, True),
    ]
    assert sub.remaining == {live} and len(broker.hub) == 1
    broker.renew(live)
    broker.release(live)
    events = _drain(sub)
    assert [ev.kind for ev in events] == [K.LEASE_EVENT_KIND_RENEWED, K.LEASE_EVENT_KIND_RELEASED]
    assert events[0].lease.expires_at == broker.t - 1 + 600 and events[0].seq > 0
    assert sub.finished and len(broker.hub) == 0  # an ended stream is let go


def test_a_replay_sends_what_a_live_stream_was_sent(broker: Broker) -> None:
    before = broker.rt.journal.last_seq + 1
    live = broker.hub.open(None, [], holder=None)  # every campaign's leases, open-ended
    a, _ = broker.grant()
    b, _ = broker.grant()
    broker.renew(a)
    broker.release(a)
    broker.release(b)
    sent = []
    while ready := live.ready(100):
        sent.extend(ready)
    assert [ev.kind for ev in sent] == [
        K.LEASE_EVENT_KIND_GRANTED,
        K.LEASE_EVENT_KIND_GRANTED,
        K.LEASE_EVENT_KIND_RENEWED,
        K.LEASE_EVENT_KIND_RELEASED,
        K.LEASE_EVENT_KIND_RELEASED,
    ]
    replayed = broker.hub.open(None, [], holder=None, from_seq=before)
    assert [_what(ev) for ev in replayed.snapshot] == [_what(ev) for ev in sent]
    # From the middle of an entry on: the events before that position are left out.
    second = sent[1]
    resumed = broker.hub.open(None, [], None, from_seq=second.seq, from_index=second.index)
    assert [_what(ev) for ev in resumed.snapshot] == [_what(ev) for ev in sent[1:]]


def _what(ev: pb.LeaseEvent) -> tuple[object, ...]:
    """What happened, as the decision says (the rest of a replayed event's lease is its
    record as it is now: an ended lease's carries its end and state)."""
    lease = ev.lease
    return (ev.kind, ev.seq, ev.index, ev.at, lease.lease_id, lease.expires_at)


def test_a_replay_out_of_range_is_refused_and_registers_nothing(broker: Broker) -> None:
    broker.grant()
    last = broker.rt.journal.last_seq
    with pytest.raises(RequestError) as err:
        broker.hub.open("sci", [], "sci", from_seq=last + 2)
    assert err.value.code is ErrorCode.OUT_OF_RANGE and "past the journal's end" in str(err.value)
    assert len(broker.hub) == 0


def test_a_rotated_token_ends_the_streams_it_opened_only(broker: Broker) -> None:
    mine = broker.hub.open("sci", [], holder="sci")
    admins = broker.hub.open(None, [], holder=None)
    broker.hub.end_holder("sci", RuntimeError("rotated"))
    with pytest.raises(RuntimeError, match="rotated"):
        _drain(mine)
    assert len(broker.hub) == 1
    broker.hub.close_all(RuntimeError("shutting down"))
    with pytest.raises(RuntimeError, match="shutting down"):
        _drain(admins)


def test_a_stream_that_falls_too_far_behind_is_closed() -> None:
    sub = Subscription(None, None)
    ev = pb.LeaseEvent(kind=K.LEASE_EVENT_KIND_RENEWED)
    for _ in range(STREAM_BACKLOG + 1):
        sub.push(ev)
    assert len(sub.ready(STREAM_BACKLOG + 10)) == STREAM_BACKLOG
    with pytest.raises(StreamOverflow):
        _drain(sub)
