"""Replay policies, one small module each, all behind ``base.Policy``: the built-ins
(``POLICIES``) and the plug-ins other distributions register (``plugins``)."""

from __future__ import annotations

from bursar.broker import compiled

# The compiled conservative backfill (``make accel``), when it is built from this source:
# before the policies are imported (hence the imports below it).
compiled.use(__name__, __path__)
# ruff: noqa: E402

from bursar.sim.replay.policies.base import Policy, PolicyFactory
from bursar.sim.replay.policies.conservative import Conservative
from bursar.sim.replay.policies.easy import Easy
from bursar.sim.replay.policies.fairshare import FairShare
from bursar.sim.replay.policies.fifo import Fifo
from bursar.sim.replay.policies.ljf import Ljf
from bursar.sim.replay.policies.plugins import GROUP, Plugin, PluginError, installed, load
from bursar.sim.replay.policies.sjf import Sjf

__all__ = [
    "GROUP",
    "POLICIES",
    "PluginError",
    "Policy",
    "PolicyFactory",
    "check_policy",
    "make_policy",
    "plugin",
    "plugin_problems",
    "policy_names",
]


def _bursar(w, config):  # type: ignore[no-untyped-def]
    # Imported on use: it pulls in the whole broker engine.
    from bursar.sim.replay.policies.bursar import BursarPolicy

    return BursarPolicy(w, config)


def _bursar_arrival(w, config):  # type: ignore[no-untyped-def]
    # The broker with fair share off: arrival order within a class. Its reservations are
    # then EASY's (with envelopes that bind nothing): the check of the reservation logic.
    from bursar.sim.replay.policies.bursar import BursarPolicy

    return BursarPolicy(w, config, fairshare=False)


POLICIES: dict[str, PolicyFactory] = {
    "fifo": Fifo,
    "easy": Easy,
    "conservative": Conservative,
    "sjf": Sjf,
    "ljf": Ljf,
    "fairshare": FairShare,
    "bursar": _bursar,
    "bursar-arrival": _bursar_arrival,
}


def policy_names() -> list[str]:
    """Every policy a replay accepts: the built-ins, then the installed plug-ins."""
    return [*POLICIES, *installed(POLICIES).plugins]


def plugin(name: str) -> Plugin | None:
    """The installed plug-in called ``name``; None for a built-in or an unknown name."""
    return None if name in POLICIES else installed(POLICIES).plugins.get(name)


def plugin_problems() -> list[str]:
    """One line per plug-in entry point refused at discovery (see ``plugins``)."""
    return list(installed(POLICIES).problems)


def check_policy(name: str) -> None:
    """ValueError naming the allowed policies (and why a refused plug-in is not one)."""
    if name in POLICIES or plugin(name) is not None:
        return
    refused = [p for p in plugin_problems() if p.startswith(f"replay policy plug-in {name!r}")]
    why = f" ({refused[0]})" if refused else ""
    raise ValueError(f"unknown policy {name!r}{why}; allowed: {', '.join(policy_names())}")


def make_policy(name: str, w, config) -> Policy:  # type: ignore[no-untyped-def]
    """The policy ``name`` over workload ``w``; a plug-in's behind its referee
    (``plugins.Refereed``), built over a read-only view of ``w`` and a copy of ``config``.
    ``PluginError`` (a ValueError) for a plug-in that cannot run."""
    factory = POLICIES.get(name)
    if factory is not None:
        return factory(w, config)
    check_policy(name)
    p = plugin(name)
    assert p is not None  # check_policy passed
    return load(p, w, config)
