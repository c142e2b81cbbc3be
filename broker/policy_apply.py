"""Applying a new policy to a broker: reading it from a request, checking it against the
engine, and journaling the change on a stopped broker's state directory.

The running broker applies a change through its service (``Admin.ApplyPolicy``, which
calls :func:`check` and then submits the event like any other); a stopped one through
:func:`apply_offline` (``bursar policy apply --state-dir``). Either way the change is one
``apply_policy`` journal entry, validated by the engine before it is written.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker import policy_change, snapshot, validation
from bursar.broker.config import policy_from_mapping
from bursar.broker.engine import Engine
from bursar.broker.errors import ConfigError, ErrorCode, JournalError, RequestError
from bursar.broker.events import ApplyPolicy
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.broker.policy import PolicySpec
from bursar.broker.specs import spec_from_dict, spec_to_dict
from bursar.broker.state_lock import LOCK_FILE, try_lock

__all__ = ["Applied", "apply_offline", "check", "from_json", "from_toml", "normalized"]


@dataclass(frozen=True, slots=True)
class Applied:
    """What a policy change did: the settings that change, as (old, new) by dotted key, and
    the journal entry it was written as (0: none, for a dry run or no change)."""

    changes: dict[str, tuple[Any, Any]]
    seq: int
    policy: PolicySpec


def normalized(policy: PolicySpec) -> PolicySpec:
    """The policy as a replay decodes it from the journal (floats where the spec says so,
    keys in order): the live engine and its replay then hold the same values."""
    return spec_from_dict(PolicySpec, spec_to_dict(policy))


def _invalid(exc: ConfigError) -> RequestError:
    return RequestError(ErrorCode.INVALID_ARGUMENT, exc.key, exc.message)


def from_json(text: str, source: str = "spec_json") -> PolicySpec:
    """A whole policy in the journal's spelling (``spec_to_dict``); settings left out take
    their defaults. Bad input raises ``RequestError`` naming ``policy.KEY``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, source, f"not JSON: {exc}") from None
    try:
        return policy_from_mapping(data, source=source)
    except ConfigError as exc:
        raise _invalid(exc) from None


def from_toml(text: str, base: PolicySpec, source: str = "toml") -> PolicySpec:
    """The ``[policy]`` table of TOML text: the settings it names change, the others keep
    ``base``'s values."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, source, f"invalid TOML: {exc}") from None
    if "policy" not in data:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            source,
            "no [policy] table; allowed: TOML with a [policy] table as in a config file",
        )
    try:
        return policy_from_mapping(data["policy"], source=source, base=base)
    except ConfigError as exc:
        raise _invalid(exc) from None


def check(engine: Engine, policy: PolicySpec, at: float) -> tuple[ApplyPolicy, dict[str, Any]]:
    """The event that puts ``policy`` in force at ``at`` and what it changes; raises
    ``RequestError`` (naming ``policy.KEY``) if the engine would refuse it. Pure."""
    event = ApplyPolicy(at=max(at, engine.now), policy=normalized(policy))
    validation.validate(engine, event)
    return event, policy_change.changes(engine.policy, event.policy)


def apply_offline(state_dir: Path, policy: PolicySpec, *, dry_run: bool = False) -> Applied:
    """Journal a policy change in a stopped broker's state directory, at the engine's last
    instant (the broker catches up with the wall clock when it starts). Refused while a
    broker serves the directory."""
    path = state_dir / JOURNAL_FILENAME
    if not path.exists():
        raise JournalError(
            f"no journal at {path}; a new broker takes its policy from --config on its "
            "first start, nothing to apply"
        )
    lock = _lock(state_dir)
    try:
        with Journal.open(path) as journal:
            engine, _ = snapshot.restore(journal, state_dir)
            event, changes = check(engine, policy, engine.now)
            if dry_run or not changes:
                return Applied(changes, 0, event.policy if changes else engine.policy)
            outcome = engine.apply(event)
            seq = journal.append(event, outcome.decisions)
            return Applied(changes, seq, event.policy)
    finally:
        os.close(lock)


def _lock(state_dir: Path) -> int:
    fd = try_lock(state_dir)
    if fd is None:
        raise JournalError(
            f"a broker is serving {state_dir} (it holds {state_dir / LOCK_FILE}): apply the "
            "policy to it while it runs (bursar policy apply --config FILE, with "
            "--admin-token-file and --target), or stop it first"
        )
    return fd
