"""The Watch hub: the open Watch streams, what each opens with, and the lease events
published to them.

A stream opens on committed state (the servicer settles the commit batch first) and is
registered in the same step as its opening is computed: either a snapshot of the watched
leases' state now, or (``from_seq``) every event the journal holds from an entry on. From
then on each lease decision is published to the streams that want it as its commit hands
it on (:meth:`WatchHub.publish`, from the runtime's listener), so nothing falls between
the opening and the live events. Every event is built in ``convert.py`` from the decision
and the lease's record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bursar.broker.codec import decision_from_dict
from bursar.broker.decisions import Decision
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.runtime import Runtime
from bursar.broker.service import convert
from bursar.broker.service.errors import StreamOverflow
from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = ["REPLAY_LIMIT", "STREAM_BACKLOG", "Subscription", "WatchHub"]

STREAM_BACKLOG = 10_000
"""Events a Watch stream may fall behind before it is closed (StreamOverflow)."""

REPLAY_LIMIT = 10_000
"""Journal entries a Watch with ``from_seq`` may replay before following live."""


@dataclass(eq=False)
class Subscription:
    """One Watch stream: the leases it follows and the events not yet sent."""

    campaign: str | None
    """Only this campaign's leases; None: every campaign's (admin)."""
    remaining: set[str] | None
    """The explicit leases still live; None: open-ended (every lease of the campaign)."""
    holder: str | None = None
    """The campaign whose token opened it (None: the admin): a rotation of that token ends
    the stream."""
    snapshot: list[pb.LeaseEvent] = field(default_factory=list)
    _queue: asyncio.Queue[pb.LeaseEvent | None] = field(default_factory=asyncio.Queue)
    _error: BaseException | None = None

    def wants(self, campaign: str, lease_id: str) -> bool:
        if self.campaign is not None and campaign != self.campaign:
            return False
        return self.remaining is None or lease_id in self.remaining

    @property
    def finished(self) -> bool:
        return self.remaining is not None and not self.remaining

    def push(self, event: pb.LeaseEvent) -> None:
        if self._error is not None:
            return
        if self._queue.qsize() >= STREAM_BACKLOG:
            self.close(StreamOverflow(self._queue.qsize()))
            return
        self._queue.put_nowait(event)
        if self.remaining is not None and event.kind in convert.END_KINDS:
            self.remaining.discard(event.lease.lease_id)
            if not self.remaining:
                self._queue.put_nowait(None)

    def close(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
            self._queue.put_nowait(None)

    def ready(self, limit: int) -> list[pb.LeaseEvent]:
        """Up to ``limit`` events already queued, without waiting: a stream that sends
        several at once (the dashboard's) pays one write for them. The end of the stream
        stays queued for ``next``."""
        out: list[pb.LeaseEvent] = []
        while len(out) < limit and not self._queue.empty():
            item = self._queue.get_nowait()
            if item is None:
                self._queue.put_nowait(None)  # nothing follows the end: it stays last
                break
            out.append(item)
        return out

    async def next(self) -> pb.LeaseEvent | None:
        """The next event; None once every watched lease has ended. Raises what closed it."""
        if self._error is not None and self._queue.empty():
            raise self._error
        item = await self._queue.get()
        if item is None and self._error is not None:
            raise self._error
        return item


class WatchHub:
    """The open Watch streams of one broker (``runtime``); ``now`` is the service's clock
    (a snapshot's time)."""

    def __init__(self, runtime: Runtime, now: Callable[[], float]) -> None:
        self.runtime = runtime
        self._now = now
        self._subs: set[Subscription] = set()

    def __len__(self) -> int:
        return len(self._subs)

    def open(
        self,
        campaign: str | None,
        lease_ids: list[str],
        holder: str | None,
        from_seq: int = 0,
        from_index: int = 0,
    ) -> Subscription:
        """Register a stream following ``lease_ids`` (none: every lease of ``campaign``,
        None: of every campaign) and compute what it opens with, atomically: a snapshot
        of those leases' state, or (``from_seq`` > 0) every event the journal holds from
        entry ``from_seq``, position ``from_index`` on. ``holder``: the campaign whose
        token opened it (see :meth:`end_holder`). Access is the caller's check."""
        sub = Subscription(campaign, set(lease_ids) if lease_ids else None, holder)
        if from_seq:
            self._replay_into(sub, from_seq, from_index)
        else:
            self._snapshot_into(sub, lease_ids)
        if not sub.finished:
            self._subs.add(sub)
        return sub

    def unwatch(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def close_all(self, error: BaseException) -> None:
        """End every stream with ``error`` (a shutdown)."""
        for sub in list(self._subs):
            sub.close(error)

    def end_holder(self, campaign: str, error: BaseException) -> None:
        """End the streams ``campaign``'s token opened (it was rotated)."""
        for sub in [s for s in self._subs if s.holder == campaign]:
            self._subs.discard(sub)
            sub.close(error)

    def publish(self, d: Decision, seq: int, index: int) -> None:
        """Send lease decision ``d`` (journal entry ``seq``, position ``index``; committed)
        to the streams that want it."""
        if not self._subs or type(d) not in convert.EVENT_KIND:
            return
        lease_id: str = d.lease_id  # type: ignore[attr-defined]
        campaign: str = d.campaign  # type: ignore[attr-defined]
        targets = [s for s in self._subs if s.wants(campaign, lease_id)]
        if not targets:
            return
        ev = self._event(d, seq, index)
        for s in targets:
            s.push(ev)
            if s.finished:
                self._subs.discard(s)

    # ------------------------------------------------------------------ opening

    def _allocation(self, lease_id: str) -> Mapping[str, str] | None:
        return self.runtime.backend.allocation(lease_id)

    def _event(self, d: Decision, seq: int, index: int) -> pb.LeaseEvent:
        lease_id: str = d.lease_id  # type: ignore[attr-defined]
        lease = convert.lease_by_id(self.runtime.engine, lease_id, self._allocation)
        return convert.lease_event(d, seq, index, lease)

    def _snapshot_into(self, sub: Subscription, ids: list[str]) -> None:
        engine = self.runtime.engine
        at = self._now()
        scope = sub.campaign
        if ids:
            targets = ids
        else:
            targets = sorted(
                (ls.id for ls in engine.holders_leases() if scope in (None, ls.campaign)),
                key=lambda x: int(x[1:]),
            )
        for lid in targets:
            ev = convert.snapshot_event(engine, lid, at, self._allocation(lid))
            if ev.kind in convert.END_KINDS:
                assert sub.remaining is not None
                sub.remaining.discard(lid)
            sub.snapshot.append(ev)

    def _replay_into(self, sub: Subscription, from_seq: int, from_index: int) -> None:
        journal = self.runtime.journal
        last = journal.last_seq
        if from_seq > last + 1:
            raise RequestError(
                ErrorCode.OUT_OF_RANGE,
                "from_seq",
                f"entry {from_seq} is past the journal's end ({last}); resume from at most "
                f"{last + 1}",
            )
        archived = journal.archived_through
        if 0 < from_seq <= archived:
            raise RequestError(
                ErrorCode.OUT_OF_RANGE,
                "from_seq",
                f"entries up to {archived} were moved to an archive; resume from at least "
                f"{archived + 1}, or open the stream without from_seq for a snapshot",
            )
        if last - from_seq >= REPLAY_LIMIT:
            raise RequestError(
                ErrorCode.OUT_OF_RANGE,
                "from_seq",
                f"entry {from_seq} is more than {REPLAY_LIMIT} entries behind the journal's "
                f"end ({last}); open the stream without from_seq for a snapshot",
            )
        for seq, decisions in journal.decisions_from(from_seq, REPLAY_LIMIT):
            for index, d in enumerate(decisions):
                if d["kind"] not in convert.LEASE_KINDS or (seq, index) < (from_seq, from_index):
                    continue
                if not sub.wants(d["campaign"], d["lease_id"]):
                    continue
                ev = self._event(decision_from_dict(d), seq, index)
                sub.snapshot.append(ev)
                if sub.remaining is not None and ev.kind in convert.END_KINDS:
                    sub.remaining.discard(d["lease_id"])
        if sub.remaining is not None:
            # A watched lease that ended before from_seq: its end was delivered before the
            # position the caller resumes from.
            sub.remaining.intersection_update(self.runtime.engine.leases)
