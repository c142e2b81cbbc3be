"""Replay policies from other distributions: the ``bursar.replay_policies`` entry points.

A distribution registers a policy by naming a factory with the built-ins' signature,
``factory(workload, config) -> Policy`` (see ``base``), under the entry-point group
``bursar.replay_policies``; the entry point's name is the policy's name::

    [project.entry-points."bursar.replay_policies"]
    wfp3 = "bursar_wfp3:Wfp3"

Discovery reads the installed distributions' metadata only: a plug-in's module is imported
when the plug-in is asked for, so a broken one costs nothing until then and never stops
a built-in. A name that clashes with a built-in, or that two distributions both claim, is
refused (the built-in, or neither, runs) and reported as a one-line problem; so is a name
the command lines cannot carry. A plug-in that fails to import, whose factory is not
callable or fails, or whose policy lacks the interface, raises ``PluginError``: one line
naming the entry point and its distribution.

The plug-in is a contestant, the kernel its referee. It sees a copy of the workload with
immutable columns and a copy of the replay config, so it cannot change the jobs the
kernel holds to account (their submit times, sizes, runtimes) or the config the metrics
and the manifest are computed from. It returns decisions only (jobs to start, kills,
wake-ups); ``Refereed`` checks that every one names a job of the workload, an instant
that is a number and an answer of the right type before the kernel acts on it, and the
kernel checks the invariants after every event (always strict for a plug-in). Metrics
and the manifest are computed from the kernel's schedule; the manifest records the
plug-in's distribution and version. A plug-in runs in the same Python process, so this
guards the replay against a policy's mistakes and against a policy that games what it
is handed, not against code that sets out to reach into the interpreter.
"""

from __future__ import annotations

import copy
import math
import operator
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from bursar.sim.replay.mapping import ReplayConfig, Workload
from bursar.sim.replay.policies.base import Policy

GROUP = "bursar.replay_policies"

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
"""A name the command lines carry as it is (``policy=NAME,capacity=N`` in whatif)."""

_METHODS = ("submit", "finish", "schedule", "wakeup", "killed")


class PluginError(ValueError):
    """A plug-in that cannot run: one line naming the entry point and its distribution."""


@dataclass(frozen=True, slots=True)
class Plugin:
    """One discovered plug-in: where it comes from, not yet imported."""

    name: str
    value: str
    """The entry point's object reference, ``module:attr``."""
    distribution: str
    version: str
    entry_point: metadata.EntryPoint

    def where(self) -> str:
        return (
            f"replay policy plug-in {self.name!r} (entry point '{self.name} = {self.value}' "
            f"of {self.distribution} {self.version})"
        )

    def provenance(self) -> dict[str, str]:
        """What a run's manifest records of the policy it ran."""
        return {
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": f"{self.name} = {self.value}",
            "group": GROUP,
        }


@dataclass(frozen=True, slots=True)
class Discovery:
    plugins: dict[str, Plugin]
    problems: list[str]
    """One line per refused entry point (a clash, a name the command lines cannot carry)."""


def _dist(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution", "unknown"
    name = dist.metadata["Name"] or "an unnamed distribution"
    return name, dist.version or "unknown"


def discover(builtins: Iterable[str]) -> Discovery:
    """The plug-ins installed on ``sys.path`` now, and the entry points refused."""
    builtin = set(builtins)
    found: dict[str, list[Plugin]] = {}
    problems: list[tuple[str, str]] = []
    seen: set[tuple[str, str, str]] = set()
    for ep in metadata.entry_points(group=GROUP):
        dist, version = _dist(ep)
        key = (ep.name, ep.value, dist)
        if key in seen:
            # The same distribution found twice on sys.path (a path listed twice).
            continue
        seen.add(key)
        p = Plugin(ep.name, ep.value, dist, version, ep)
        if ep.name in builtin:
            problems.append(
                (
                    ep.name,
                    f"{p.where()} refused: {ep.name!r} is a built-in policy; "
                    "rename the entry point",
                )
            )
        elif not NAME_RE.fullmatch(ep.name):
            problems.append(
                (
                    ep.name,
                    f"{p.where()} refused: a policy name is lower-case letters, digits, '_', "
                    "'.' and '-', starting with a letter or digit, at most 64 characters",
                )
            )
        else:
            found.setdefault(ep.name, []).append(p)
    plugins: dict[str, Plugin] = {}
    for name, ps in sorted(found.items()):
        if len(ps) == 1:
            plugins[name] = ps[0]
            continue
        dists = " and ".join(f"{p.distribution} {p.version}" for p in ps)
        problems.append(
            (
                name,
                f"replay policy plug-in {name!r} refused: {dists} both register it; "
                "uninstall one or rename its entry point",
            )
        )
    # By name: the order entry points are found in is the file system's.
    return Discovery(plugins, [line for _, line in sorted(problems)])


_cache: tuple[tuple[str, ...], frozenset[str], Discovery] | None = None


def installed(builtins: Iterable[str]) -> Discovery:
    """``discover``, once per ``sys.path`` (a test or a session that changes it sees the
    plug-ins on the new one)."""
    global _cache
    key = tuple(sys.path)
    names = frozenset(builtins)
    if _cache is None or _cache[0] != key or _cache[1] != names:
        _cache = (key, names, discover(names))
    return _cache[2]


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """What a plug-in sees of the workload: ``Workload``'s fields, every column a tuple.

    A copy: the kernel and the metrics read their own ``Workload``, which the plug-in never
    holds, and these columns cannot be assigned to."""

    capacity: int
    unit: str
    job_id: tuple[int, ...]
    submit: tuple[float, ...]
    size: tuple[int, ...]
    duration: tuple[float, ...]
    hold: tuple[float, ...]
    campaign: tuple[int, ...]
    campaign_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.job_id)


def view(w: Workload) -> WorkloadView:
    return WorkloadView(
        w.capacity,
        w.unit,
        tuple(w.job_id),
        tuple(w.submit),
        tuple(w.size),
        tuple(w.duration),
        tuple(w.hold),
        tuple(w.campaign),
        tuple(w.campaign_names),
    )


def load(p: Plugin, w: Workload, config: ReplayConfig) -> Refereed:
    """Import ``p``, build its policy over a read-only view and wrap it for the referee."""
    try:
        factory = p.entry_point.load()
    except Exception as e:  # any import-time failure is the plug-in's, reported in one line
        raise PluginError(f"{p.where()} failed to import: {_one_line(e)}") from None
    if not callable(factory):
        raise PluginError(
            f"{p.where()} names an object of type {type(factory).__name__}, not a factory: "
            "it must name a callable factory(workload, config) -> policy"
        )
    try:
        policy = factory(view(w), copy.deepcopy(config))
    except Exception as e:
        raise PluginError(f"{p.where()}: its factory failed: {_one_line(e)}") from None
    missing = [m for m in _METHODS if not callable(getattr(policy, m, None))]
    flags = [f for f in ("timed", "kills") if not isinstance(getattr(policy, f, None), bool)]
    if missing or flags:
        what = [f"no method {', '.join(missing)}"] if missing else []
        what += [f"{', '.join(flags)} not a bool"] if flags else []
        raise PluginError(
            f"{p.where()}: its factory returned an object of type {type(policy).__name__} "
            f"without the replay policy interface ({'; '.join(what)}); see bursar.sim.replay.policies.base.Policy"
        )
    return Refereed(p, policy, len(w))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class Refereed:
    """A plug-in's policy as the kernel sees it: every answer checked before it is used.

    The kernel's own checks assume a policy that names jobs by their workload index; a
    plug-in's answers are first made plain (a list of ints, pairs of an int and a float,
    a bool or None) and checked to name jobs of the workload, so that what the kernel
    records is what the plug-in decided. An exception raised inside the plug-in becomes
    one ``PluginError`` line with the call and the instant."""

    def __init__(self, plugin: Plugin, policy: Policy, n: int) -> None:
        self.plugin = plugin
        self.policy = policy
        self.n = n
        self.name = plugin.name
        self.timed = bool(policy.timed)
        self.kills = bool(policy.kills)
        self.now = -math.inf
        """The instant of the last call that carries one (wakeup and killed do not)."""

    def _call(self, what: str, now: float, f: Callable[..., Any], *args: Any) -> Any:
        try:
            return f(*args)
        except PluginError:
            raise
        except Exception as e:
            raise PluginError(
                f"{self.plugin.where()} raised in {what} at t={now:g}: {_one_line(e)}"
            ) from None

    def _bad(self, what: str, now: float, got: object) -> PluginError:
        shown = repr(got)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return PluginError(
            f"{self.plugin.where()}: {what} at t={now:g} returned {shown}; expected {_EXPECT[what]}"
        )

    def _job(self, what: str, now: float, j: object) -> int:
        if isinstance(j, bool):
            raise self._bad(what, now, j)
        try:
            k = operator.index(j)  # type: ignore[arg-type]
        except TypeError:
            raise self._bad(what, now, j) from None
        if not 0 <= k < self.n:
            raise self._bad(what, now, j)
        return k

    def submit(self, j: int, now: float) -> bool | None:
        self.now = now
        r = self._call("submit", now, self.policy.submit, j, now)
        if r is not None and not isinstance(r, bool):
            raise self._bad("submit", now, r)
        return r

    def finish(self, j: int, now: float) -> None:
        self.now = now
        self._call("finish", now, self.policy.finish, j, now)

    def schedule(self, now: float, free: int) -> list[int]:
        self.now = now
        r = self._call("schedule", now, self.policy.schedule, now, free)
        try:
            jobs = list(r)
        except TypeError:
            raise self._bad("schedule", now, r) from None
        return [self._job("schedule", now, j) for j in jobs]

    def wakeup(self) -> float | None:
        r = self._call("wakeup", self.now, self.policy.wakeup)
        if r is None:
            return None
        if isinstance(r, bool) or not isinstance(r, int | float) or math.isnan(r):
            raise self._bad("wakeup", self.now, r)
        return float(r)

    def killed(self) -> list[tuple[int, float]]:
        r = self._call("killed", self.now, self.policy.killed)
        out = []
        try:
            pairs = list(r)
        except TypeError:
            raise self._bad("killed", self.now, r) from None
        for pair in pairs:
            try:
                j, at = pair
            except (TypeError, ValueError):
                raise self._bad("killed", self.now, pair) from None
            if isinstance(at, bool) or not isinstance(at, int | float) or math.isnan(at):
                raise self._bad("killed", self.now, pair)
            out.append((self._job("killed", self.now, j), float(at)))
        return out


_EXPECT = {
    "submit": "None, True or False",
    "schedule": "a list of job indices of the workload",
    "wakeup": "None or a time in seconds",
    "killed": "a list of (job index, end time) pairs",
}
