"""The policy in force and what a change does, as the Admin service answers them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bursar.protos.bursar.v1 import admin_pb2

__all__ = ["PolicyApplied", "PolicyChange", "PolicyState"]


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """One setting that changes: its dotted key and its value in force and the new one
    (None where a side has none)."""

    key: str
    old: Any
    new: Any

    @classmethod
    def from_proto(cls, m: admin_pb2.PolicyChange) -> PolicyChange:
        return cls(m.key, json.loads(m.old_json), json.loads(m.new_json))

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "old": self.old, "new": self.new}


@dataclass(frozen=True, slots=True)
class PolicyState:
    """A policy (``spec``: every setting, in the journal's spelling) and the journal entry
    of its last change (0: the one the journal was written with)."""

    spec: dict[str, Any]
    changed_at: int

    @classmethod
    def from_proto(cls, m: admin_pb2.Policy) -> PolicyState:
        return cls(json.loads(m.spec_json), m.changed_at)

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "changed_at": self.changed_at}


@dataclass(frozen=True, slots=True)
class PolicyApplied:
    """What ``apply_policy`` did: the changes, sorted by key; whether one was journaled
    (``seq``, its entry; 0 for a dry run or no change); the policy in force after (for a
    dry run, the one that would be)."""

    changes: tuple[PolicyChange, ...]
    applied: bool
    seq: int
    policy: PolicyState

    @classmethod
    def from_proto(cls, m: admin_pb2.ApplyPolicyResponse) -> PolicyApplied:
        return cls(
            tuple(PolicyChange.from_proto(c) for c in m.changes),
            m.applied,
            m.seq,
            PolicyState.from_proto(m.policy),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "changes": [c.to_json() for c in self.changes],
            "applied": self.applied,
            "seq": self.seq,
            "policy": self.policy.to_json(),
        }
