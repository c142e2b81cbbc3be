"""Replay policies, one small module each, all behind ``base.Policy``."""

from __future__ import annotations

from bursar.sim.replay.policies.base import Policy, PolicyFactory
from bursar.sim.replay.policies.conservative import Conservative
from bursar.sim.replay.policies.easy import Easy
from bursar.sim.replay.policies.fairshare import FairShare
from bursar.sim.replay.policies.fifo import Fifo
from bursar.sim.replay.policies.ljf import Ljf
from bursar.sim.replay.policies.sjf import Sjf

__all__ = ["POLICIES", "Policy", "PolicyFactory", "make_policy"]


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


def make_policy(name: str, w, config) -> Policy:  # type: ignore[no-untyped-def]
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; allowed: {', '.join(POLICIES)}") from None
    return factory(w, config)
