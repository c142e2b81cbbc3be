"""What one applied event produced: the answer to its own request, and the effects on others.

``Engine.apply(event)`` returns an :class:`Outcome`. Its decisions are in the order the
engine made them (the order the journal records), and it reads like that list (iterate,
index, ``len``). Two things make it more than a list:

* ``own`` is the decision that answers the event's own request, if it has one: the Granted,
  Queued or Rejected of a RequestLease (the Granted if the request was queued and granted in the
  same pass), the Renewed or Rejected of a Renew, the Released of a Release, the Metered of
  a Meter, ... Callers read it instead of searching the list for "their" decision.
* ``seq`` is the journal entry that records the event, set by the runtime once the entry is
  committed (0 before). A decision's position in the journal is ``(seq, index)``: what Watch
  streams carry so that a client resumes without a gap or a duplicate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from bursar.broker.decisions import Decision

__all__ = ["Outcome"]


@dataclass(frozen=True, slots=True, eq=False)
class Outcome(Sequence[Decision]):
    decisions: tuple[Decision, ...] = ()
    own: Decision | None = None
    seq: int = 0

    @property
    def effects(self) -> tuple[Decision, ...]:
        """Every decision except ``own``: what the event did to other requests and leases."""
        return tuple(d for d in self.decisions if d is not self.own)

    def committed(self, seq: int) -> Outcome:
        """This outcome as recorded by journal entry ``seq``."""
        # Not dataclasses.replace: this runs on every request, and replace costs 3 us.
        return Outcome(self.decisions, self.own, seq)

    @overload
    def __getitem__(self, i: int) -> Decision: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Decision]: ...
    def __getitem__(self, i: int | slice) -> Decision | Sequence[Decision]:
        return self.decisions[i]

    def __len__(self) -> int:
        return len(self.decisions)

    def __iter__(self) -> Iterator[Decision]:
        return iter(self.decisions)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Outcome):
            return (self.decisions, self.own, self.seq) == (other.decisions, other.own, other.seq)
        if isinstance(other, list | tuple):
            return list(self.decisions) == list(other)
        return NotImplemented

    def __add__(self, other: Sequence[Decision]) -> list[Decision]:
        # Concatenates like the list of decisions it replaced (``a + b``, ``a += b``).
        return [*self.decisions, *other]

    def __radd__(self, other: Sequence[Decision]) -> list[Decision]:
        return [*other, *self.decisions]
