"""A pool backend on a real Slurm cluster: every placed lease is a Slurm allocation.

The engine still decides everything (admission, placement, revocation); this backend is the
shell that makes its decisions real on Slurm, and tells it what Slurm did behind its back.

* The pool is the partition's nodes (``sinfo --json``): CPUs, GPUs (the ``gpu`` GRES) and
  memory per node. The engine names nodes ``{prefix}{index:03d}``; :func:`layout` maps those
  names to Slurm's, in Slurm's natural node order, so the same cluster always gives the same
  names (the journal keeps them).
* ``place`` turns the engine's per-node placement into one allocation made with
  ``salloc --no-shell --immediate`` (scheduled inline, no batch tick), so that each node
  holds exactly the piece the engine put there: a plain job when the pieces are equal (one
  node, or whole nodes: ``-w NODES -N k --ntasks-per-node=1 -c CPUS --gres=gpu:G``), else a
  heterogeneous job with one single-node component per piece (Slurm starts those from its
  backfill scheduler, so within ``bf_interval``). A piece always takes at least one CPU,
  because Slurm cannot run a job step on none; memory is asked for only when the piece has
  some. The job is named ``{job_prefix}-{lease id}``; its id, nodes and GPU indices are
  what :meth:`SlurmPool.allocation` reports for the lease. The pieces come with the engine's
  Granted or Activated decision. A Slurm refusal raises ``PlaceFailed``: the actuator ends the
  lease with Slurm's answer as the cause (``LeaseLost``: the grant is already journaled).
  ``salloc`` may wait up to ``allocate_timeout_s``; the pool is ``slow``, so the service
  makes allocations on the actuator's worker threads, never on its event loop.
* ``unplace`` (release, expiry, revocation) cancels the job: Slurm sends its steps SIGTERM,
  then SIGKILL after KillWait. With ``warn_signal`` the steps also get that signal at the
  lease's preemption warning, a grace period before the revocation.
* Every ``poll_interval_s`` the backend compares its allocations and nodes with Slurm's
  (``squeue --json``, ``sinfo --json``): an allocation that is gone ends its lease as
  revoked (``LeaseLost`` with Slurm's job state as the cause); a node Slurm marks down or
  drained is reported ``NodeLost``, one that comes back ``NodeReady``; a job with the prefix
  that belongs to no lease is cancelled.
* After a broker restart ``adopt`` takes the active leases from the journal, re-adopts their
  allocations by name, cancels every other job with the prefix, and reports the leases
  whose allocations vanished while the broker was down at the first poll.

Slurm is only ever read through ``--json`` output; the commands run with the environment's
``SLURM_CONF``. Event times are the scheduled poll times, read from the pool's clock
(``bursar.broker.clock``, the wall clock by default), so the journal stays in step with the
clock the service runs on.
"""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

from bursar.broker.backends.base import (
    NO_ALLOCATION,
    NO_PIECES,
    BackendError,
    NodeState,
    Pieces,
    PlaceFailed,
    PoolBackend,
    check_clock,
    check_nodes,
)
from bursar.broker.clock import Clock, as_clock
from bursar.broker.config import DiscoveryError, SlurmSettings, WarnSignal
from bursar.broker.events import Event, LeaseLost, NodeLost, NodeReady
from bursar.broker.policy import NodeGroup, PoolSpec

__all__ = [
    "Allocation",
    "SlurmCli",
    "SlurmError",
    "SlurmJob",
    "SlurmNode",
    "SlurmPool",
    "discover_pool",
    "layout",
]

log = logging.getLogger(__name__)

# Node states (sinfo --json "state", "state_flags") in which a node can hold allocations.
_USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
_UNUSABLE_FLAGS = frozenset(
    {"DRAIN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "MAINTENANCE"}
)
# Job states in which an allocation still holds its resources.
_HOLDING = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})
# Job states of a job that is not over yet (an orphan in one of these gets cancelled).
_LIVE = _HOLDING | {"PENDING", "REQUEUED", "RESIZING"}


class SlurmError(BackendError):
    """A Slurm command failed or answered something this backend cannot read."""


# ------------------------------------------------------------------------------ Slurm's view


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    cpus: int
    gpus: int
    mem_mb: int
    state: str
    flags: tuple[str, ...]
    partitions: tuple[str, ...]
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.state in _USABLE_STATES and not _UNUSABLE_FLAGS.intersection(self.flags)

    @property
    def describe(self) -> str:
        flags = "+".join(f.lower() for f in self.flags)
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.state}{'+' + flags if flags else ''}{why}"


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job as ``squeue --json`` shows it (a heterogeneous job: one per component)."""

    job_id: int
    leader: int
    """The heterogeneous job's leader id (the job's own id for a plain job)."""
    offset: int
    name: str
    state: str
    reason: str
    nodes: str
    """Slurm's host list, e.g. "node1" or "node[1-2]" (only compared, never expanded)."""
    node_count: int
    cpus: int
    gres_detail: tuple[str, ...]
    """Per node, in Slurm's node order, e.g. ("gpu:2(IDX:0-1)",)."""


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]: ...


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


class SlurmCli:
    """Slurm's commands, read through their ``--json`` output only."""

    def __init__(self, runner: Runner = _run, timeout_s: float = 30.0) -> None:
        self._runner = runner
        self._timeout_s = timeout_s

    def _call(self, argv: Sequence[str], timeout: float | None = None) -> str:
        try:
            out = self._runner(argv, timeout or self._timeout_s)
        except FileNotFoundError:
            raise SlurmError(
                f"{argv[0]} not found: install the Slurm client commands (slurm-client) "
                "and point SLURM_CONF at the cluster's slurm.conf"
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(argv[:3])} did not answer within {timeout}s") from None
        if out.returncode != 0:
            msg = (out.stderr or out.stdout).strip().splitlines()
            raise SlurmError(
                f"{' '.join(argv[:2])} failed ({out.returncode}): {msg[-1] if msg else '?'}"
            )
        return out.stdout

    def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        text = self._call(argv)
        try:
            data = json_loads(text)
        except ValueError as exc:
            raise SlurmError(f"{argv[0]} --json gave no JSON ({exc})") from None
        errors = data.get("errors") or []
        if errors:
            raise SlurmError(f"{argv[0]}: {errors[0].get('error', errors[0])}")
        return data

    def nodes(self) -> list[SlurmNode]:
        data = self._json(["sinfo", "--json"])
        out = []
        for n in data.get("nodes", []):
            out.append(
                SlurmNode(
                    name=str(n["name"]),
                    cpus=int(n.get("cpus") or 0),
                    gpus=gres_count(str(n.get("gres") or ""), "gpu"),
                    mem_mb=int(n.get("real_memory") or 0),
                    state=str(n.get("state") or "unknown").lower(),
                    flags=tuple(str(f).upper() for f in n.get("state_flags") or ()),
                    partitions=tuple(str(p) for p in n.get("partitions") or ()),
                    reason=str(n.get("reason") or ""),
                )
            )
        return out

    def partitions(self) -> list[str]:
        return sorted({p for n in self.nodes() for p in n.partitions})

    def jobs(self) -> list[SlurmJob]:
        data = self._json(["squeue", "--json"])
        out = []
        for j in data.get("jobs", []):
            jid = int(j["job_id"])
            leader = int(j.get("het_job_id") or 0) or jid
            out.append(
                SlurmJob(
                    job_id=jid,
                    leader=leader,
                    offset=int(j.get("het_job_offset") or 0),
                    name=str(j.get("name") or ""),
                    state=str(j.get("job_state") or "").upper(),
                    reason=str(j.get("state_reason") or ""),
                    nodes=str(j.get("nodes") or ""),
                    node_count=int(j.get("node_count") or 1),
                    cpus=int(j.get("cpus") or 0),
                    gres_detail=tuple(str(d) for d in j.get("gres_detail") or ()),
                )
            )
        return out

    def allocate(self, argv: Sequence[str], timeout_s: float) -> None:
        self._call(argv, timeout=timeout_s + 30.0)

    def cancel(self, job_ids: Iterable[int], signal: str | None = None) -> None:
        ids = [str(j) for j in job_ids]
        if not ids:
            return
        argv = ["scancel", *([f"--signal={signal}"] if signal else []), *ids]
        self._call(argv)


def json_loads(text: str) -> dict[str, Any]:
    import json

    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("top level is not an object")
    return data


_GRES_ITEM = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?:(?P<count>\d+)")


def gres_count(gres: str, name: str) -> int:
    """Units of GRES ``name`` in a Slurm GRES string such as "gpu:8" or
    "gpu:a100:4(S:0-1),gpu:v100:2"."""
    total = 0
    for item in _split_gres(gres):
        m = _GRES_ITEM.match(item)
        if m and m["name"] == name:
            total += int(m["count"])
    return total


def gres_indices(detail: str, name: str) -> str:
    """The indices in a gres_detail entry such as "gpu:2(IDX:0-1)" as "0,1"."""
    for item in _split_gres(detail):
        if item.split(":", 1)[0] != name:
            continue
        m = re.search(r"IDX:([0-9,\-]+)", item)
        if m:
            return ",".join(str(i) for i in expand_ranges(m.group(1)))
    return ""


def expand_ranges(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _split_gres(s: str) -> list[str]:
    # Commas separate items except inside parentheses, e.g. "gpu:4(S:0-1),gpu:2(IDX:0,2)".
    items, depth, cur = [], 0, ""
    for ch in s:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur:
        items.append(cur)
    return [i.strip() for i in items if i.strip()]


def natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


# ------------------------------------------------------------------------------ the pool


def layout(nodes: Sequence[SlurmNode]) -> tuple[tuple[NodeGroup, ...], dict[str, str]]:
    """Node groups for the engine and engine name → Slurm name, from a partition's nodes.

    Nodes of one shape (CPUs, GPUs, memory) form a group, in Slurm's natural node order;
    one shape gives ``slurm000``, ``slurm001``...; several give ``slurm0-000``..."""
    ordered = sorted(nodes, key=lambda n: natural_key(n.name))
    shapes: dict[tuple[int, int, int], list[SlurmNode]] = {}
    for n in ordered:
        shapes.setdefault((n.cpus, n.gpus, n.mem_mb), []).append(n)
    groups, names = [], {}
    for k, ((cpus, gpus, mem_mb), members) in enumerate(shapes.items()):
        prefix = "slurm" if len(shapes) == 1 else f"slurm{k}-"
        resources = {"gpu": float(gpus), "cpu": float(cpus), "mem_gb": mem_mb / 1024.0}
        groups.append(
            NodeGroup(count=len(members), resources=resources, warm=len(members), prefix=prefix)
        )
        for i, n in enumerate(members):
            names[f"{prefix}{i:03d}"] = n.name
    return tuple(groups), names


def partition_nodes(cli: SlurmCli, settings: SlurmSettings) -> tuple[str, list[SlurmNode]]:
    """The partition the settings name (or Slurm's default) and its nodes."""
    nodes = cli.nodes()
    known = sorted({p for n in nodes for p in n.partitions})
    partition = settings.partition
    if partition is None:
        # Slurm 22.05 shows no partition flags (Default=YES) in any JSON output: without a
        # choice in the config, only a cluster with a single partition is unambiguous.
        if len(known) != 1:
            raise DiscoveryError(
                "slurm.partition",
                "required when Slurm has more than one partition; allowed: "
                f"{', '.join(known) or '(none found: is SLURM_CONF set?)'}",
            )
        partition = known[0]
    members = [n for n in nodes if partition in n.partitions]
    if not members:
        raise DiscoveryError(
            "slurm.partition",
            f"no partition {partition!r} with nodes in Slurm; allowed: "
            f"{', '.join(known) or '(none found: is SLURM_CONF set?)'}",
        )
    return partition, members


def discover_pool(settings: SlurmSettings, cli: SlurmCli | None = None) -> PoolSpec:
    """The pool of ``settings.partition`` as the engine sees it (every node warm: Slurm powers
    its own nodes). Raises DiscoveryError for a partition Slurm does not have."""
    try:
        _, members = partition_nodes(cli or SlurmCli(), settings)
    except SlurmError as exc:
        raise DiscoveryError("slurm", f"cannot read the pool from Slurm: {exc}") from None
    groups, _ = layout(members)
    return PoolSpec(groups=groups, boot_latency_s=0.0)


@dataclass(slots=True)
class Allocation:
    """A lease's Slurm allocation: a plain job (one node, or several with equal pieces) or a
    heterogeneous job with one single-node component per node."""

    lease_id: str
    job_id: int
    nodes: tuple[str, ...]
    """Slurm's node names: a heterogeneous job's in component order, else in Slurm's order."""
    components: list[SlurmJob] = field(default_factory=list)

    def describe(self, partition: str) -> dict[str, str]:
        het = len(self.components) > 1
        out = {
            "backend": "slurm",
            "job_id": str(self.job_id),
            "partition": partition,
            "nodes": ",".join(self.nodes),
            "node_count": str(len(self.nodes)),
            "het_groups": str(len(self.components)),
        }
        for i, node in enumerate(self.nodes):
            c = self.components[i if het else 0]
            detail = (
                c.gres_detail[0 if het else i] if len(c.gres_detail) > (0 if het else i) else ""
            )
            out[f"cpus.{node}"] = str(c.cpus if het else c.cpus // max(1, c.node_count))
            gpus = gres_indices(detail, "gpu")
            if gpus:
                out[f"gpus.{node}"] = gpus
        return out


class SlurmPool(PoolBackend):
    """A ``PoolBackend`` on a Slurm partition (see the module docstring).

    Every call may run Slurm's commands (``salloc`` waits up to ``allocate_timeout_s``), so
    the pool is ``slow``: the service drives it from the actuator's worker threads, and its
    state is kept under a lock so that a lease's allocation can be made while others are
    released or the poll runs. Slurm's commands run outside the lock.
    """

    slow: ClassVar[bool] = True

    def __init__(
        self,
        settings: SlurmSettings,
        *,
        cli: SlurmCli | None = None,
        clock: Clock | Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        self._cli = cli or SlurmCli()
        self._clock = as_clock(clock)
        self.partition, members = partition_nodes(self._cli, settings)
        _, self._slurm_name = layout(members)
        self._engine_name = {s: e for e, s in self._slurm_name.items()}
        self._lock = threading.RLock()
        self._state: dict[str, NodeState] = {n: NodeState.ON for n in self._slurm_name}
        self._allocs: dict[str, Allocation] = {}
        self._allocating: set[str] = set()
        """Leases whose salloc is running: their job may be in squeue before it is here."""
        self._cancelled: set[int] = set()
        """Jobs of leases taken off (scancel sent): squeue may list them a while longer."""
        self._lease_nodes: dict[str, tuple[str, ...]] = {}
        self._lost_while_down: dict[str, str] = {}
        self._due: list[Event] = []
        self._now = -math.inf
        self._next_poll = self._clock.now()
        self.orphans_cancelled: list[int] = []
        """Job ids cancelled because they belonged to no lease (for logs and tests)."""

    # -- wiring -------------------------------------------------------------------------

    @property
    def job_prefix(self) -> str:
        return self.settings.job_prefix

    def job_name(self, lease_id: str) -> str:
        return f"{self.settings.job_prefix}-{lease_id}"

    def slurm_node(self, engine_node: str) -> str:
        return self._slurm_name[engine_node]

    def allocations(self) -> Mapping[str, Allocation]:
        return MappingProxyType(self._allocs)

    # -- PoolBackend --------------------------------------------------------------------

    @property
    def boot_latency_s(self) -> float:
        return 0.0

    def node_states(self) -> Mapping[str, NodeState]:
        return MappingProxyType(self._state)

    def placements(self) -> Mapping[str, tuple[str, ...]]:
        return MappingProxyType(self._lease_nodes)

    def allocation(self, lease_id: str) -> Mapping[str, str]:
        """What a client needs to run inside the lease's allocation (empty until it is made)."""
        with self._lock:
            a = self._allocs.get(lease_id)
            return a.describe(self.partition) if a is not None else NO_ALLOCATION

    def start(self, nodes: Iterable[str], now: float) -> None:
        # Slurm's nodes are always on (Slurm does its own power saving): a start is ready
        # at once.
        with self._lock:
            names = self._known(nodes)
            self._advance(now)
            for n in names:
                if self._state[n] is NodeState.COLD:
                    self._state[n] = NodeState.ON
                    self._due.append(NodeReady(at=now, node=n))

    def stop(self, nodes: Iterable[str], now: float) -> None:
        with self._lock:
            names = self._known(nodes)
            self._advance(now)
            held = {n for ns in self._lease_nodes.values() for n in ns}
            for n in names:
                if self._state[n] is NodeState.ON and n not in held:
                    self._state[n] = NodeState.COLD

    def place(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        with self._lock:
            names = self._known(nodes)
            self._advance(now)
            if lease_id in self._allocs or lease_id in self._allocating:
                job = self._allocs[lease_id].job_id if lease_id in self._allocs else "pending"
                raise BackendError(f"lease {lease_id!r} already has Slurm job {job}")
            argv = self._salloc_argv(lease_id, names, pieces)
            self._allocating.add(lease_id)
        try:
            comps = self._allocate(lease_id, argv)
        except BaseException as exc:
            with self._lock:
                self._allocating.discard(lease_id)
            if not isinstance(exc, SlurmError):
                raise
            # The engine has granted the lease and the journal holds the grant: the lease
            # ends as revoked, with Slurm's answer as the reason.
            log.warning("lease %s: no Slurm allocation: %s", lease_id, exc)
            raise PlaceFailed(f"slurm: {exc}") from None
        with self._lock:
            # In one step, so that a poll never sees the job as belonging to no lease.
            self._allocating.discard(lease_id)
            self._allocs[lease_id] = self._allocation(lease_id, names, comps)
            self._lease_nodes[lease_id] = names

    def unplace(self, lease_id: str, now: float) -> None:
        with self._lock:
            self._advance(now)
            self._lost_while_down.pop(lease_id, None)
            a = self._allocs.pop(lease_id, None)
            self._lease_nodes.pop(lease_id, None)
            if a is not None:
                self._cancelled.add(a.job_id)
        if a is None:
            return
        try:
            self._cli.cancel([a.job_id])
        except SlurmError as exc:
            # Left to the next poll: a job with our prefix and no lease is an orphan.
            log.warning("lease %s: scancel %d failed: %s", lease_id, a.job_id, exc)

    def warn(self, lease_id: str, deadline: float, now: float) -> None:
        """The lease is warned of preemption: signal its steps if configured."""
        with self._lock:
            self._advance(now)
            a = self._allocs.get(lease_id)
        sig = self.settings.warn_signal
        if a is None or sig is WarnSignal.NONE:
            return
        try:
            self._cli.cancel([a.job_id], signal=sig.value)
        except SlurmError as exc:
            log.warning("lease %s: could not signal job %d: %s", lease_id, a.job_id, exc)

    def due_events(self, now: float) -> list[Event]:
        with self._lock:
            self._advance(now)
            poll = now >= self._next_poll
        if poll:
            self._poll(now)
            with self._lock:
                # Polls follow the clock even when the caller catches up on old timers.
                self._next_poll = max(now, self._clock.now()) + self.settings.poll_interval_s
        with self._lock:
            out, self._due = sorted(self._due, key=lambda e: e.at), []
        return out

    def next_event_time(self) -> float | None:
        with self._lock:
            times = [e.at for e in self._due]
            times.append(self._next_poll)
            return max(self._now, min(times))

    def adopt(
        self,
        nodes: Mapping[str, tuple[NodeState, float | None]],
        placements: Mapping[str, tuple[str, ...]],
        now: float,
    ) -> None:
        self._known(nodes)
        self._known([n for ns in placements.values() for n in ns])
        jobs = self._our_jobs()
        with self._lock:
            self._now = max(self._now, float(now))
            self._next_poll = max(self._now, self._clock.now())
            for name, (state, _) in nodes.items():
                # Booting or cold nodes do not exist on Slurm: they are on.
                self._state[name] = NodeState.DOWN if state is NodeState.DOWN else NodeState.ON
            by_lease: dict[str, list[SlurmJob]] = {}
            for j in jobs:
                by_lease.setdefault(j.name[len(self.settings.job_prefix) + 1 :], []).append(j)
            self._allocs, self._lease_nodes, self._lost_while_down = {}, {}, {}
            for lid, ns in placements.items():
                comps = [j for j in by_lease.get(lid, []) if j.state in _HOLDING]
                if comps:
                    leader = comps[0].leader
                    comps = sorted((c for c in comps if c.leader == leader), key=lambda c: c.offset)
                    self._allocs[lid] = self._allocation(lid, ns, comps)
                    log.info("lease %s: re-adopted Slurm job %d", lid, leader)
                else:
                    self._lost_while_down[lid] = (
                        f"slurm allocation {self.job_name(lid)} gone while the broker was down"
                    )
                self._lease_nodes[lid] = tuple(ns)
            keep = {a.job_id for a in self._allocs.values()}
        # A new journal has no placements: every job with our prefix is left over.
        self._cancel_orphans(jobs, keep)

    # -- Slurm --------------------------------------------------------------------------

    def _salloc_argv(self, lease_id: str, names: tuple[str, ...], pieces: Pieces) -> list[str]:
        s = self.settings
        name = self.job_name(lease_id)
        common = [
            f"--job-name={name}",
            f"--comment=bursar lease {lease_id}",
            f"--partition={self.partition}",
        ]
        if s.time_limit_min:
            common.append(f"--time={s.time_limit_min}")
        if s.account:
            common.append(f"--account={s.account}")
        if s.qos:
            common.append(f"--qos={s.qos}")
        argv = ["salloc", "--no-shell", f"--immediate={s.allocate_timeout_s}", "--quiet"]
        shapes = [_shape(pieces.get(node, {})) for node in names]
        if len(set(shapes)) == 1:
            # One plain job: scheduled inline by salloc, exactly the engine's pieces since
            # they are equal on every node.
            slurm_nodes = ",".join(self._slurm_name[n] for n in names)
            argv += [*common, f"--nodelist={slurm_nodes}", f"--nodes={len(names)}"]
            argv += [f"--ntasks={len(names)}", "--ntasks-per-node=1", *_shape_args(shapes[0])]
        else:
            # Unequal pieces: a heterogeneous job, one component per node. Exact, but Slurm
            # starts heterogeneous jobs from its backfill scheduler (bf_interval) only.
            for k, node in enumerate(names):
                if k:
                    argv.append(":")
                argv += [*common, f"--nodelist={self._slurm_name[node]}", "--nodes=1"]
                argv += ["--ntasks=1", *_shape_args(shapes[k])]
        return argv

    def _allocate(self, lease_id: str, argv: Sequence[str]) -> list[SlurmJob]:
        """Run ``argv`` (salloc) and return the running job's components, in order."""
        name = self.job_name(lease_id)
        self._cli.allocate(argv, self.settings.allocate_timeout_s)
        comps = [j for j in self._cli.jobs() if j.name == name and j.state in _HOLDING]
        if not comps:
            raise SlurmError(f"salloc succeeded but no running job {name} is in squeue")
        leader = max(c.leader for c in comps)  # the newest, should an old one linger
        return sorted((c for c in comps if c.leader == leader), key=lambda c: c.offset)

    def _allocation(
        self, lease_id: str, engine_nodes: Sequence[str], comps: list[SlurmJob]
    ) -> Allocation:
        slurm = [self._slurm_name[n] for n in engine_nodes]
        if len(comps) == 1:
            slurm = sorted(slurm, key=natural_key)  # Slurm lists a job's nodes in its order
        return Allocation(lease_id, comps[0].leader, tuple(slurm), comps)

    def _our_jobs(self) -> list[SlurmJob]:
        prefix = self.settings.job_prefix + "-"
        try:
            jobs = self._cli.jobs()
        except SlurmError as exc:
            log.warning("cannot list Slurm jobs: %s", exc)
            return []
        return [j for j in jobs if j.name.startswith(prefix) and j.state in _LIVE]

    def _cancel_orphans(self, jobs: Sequence[SlurmJob], keep: set[int]) -> None:
        orphans = sorted({j.leader for j in jobs if j.leader not in keep})
        if not orphans:
            return
        log.warning("cancelling Slurm jobs that belong to no lease: %s", orphans)
        try:
            self._cli.cancel(orphans)
        except SlurmError as exc:
            log.warning("could not cancel orphans %s: %s", orphans, exc)
            return
        with self._lock:
            self.orphans_cancelled.extend(orphans)

    def _poll(self, now: float) -> None:
        with self._lock:
            # Only allocations made before Slurm is asked can be judged by its answer.
            before = dict(self._allocs)
        try:
            nodes = {n.name: n for n in self._cli.nodes()}
            jobs = self._cli.jobs()
        except SlurmError as exc:
            # Slurm unreachable is not a reason to revoke anything: try again next poll.
            log.warning("Slurm poll failed: %s", exc)
            return
        prefix = self.settings.job_prefix + "-"
        with self._lock:
            self._compare(now, nodes, jobs, before)
            ours = [j for j in jobs if j.name.startswith(prefix) and j.state in _LIVE]
            # A job whose salloc is still running (or returned after squeue answered)
            # belongs to its lease even though the lease has no allocation here yet.
            busy = self._allocating | set(self._allocs)
            ours = [j for j in ours if j.name[len(prefix) :] not in busy]
            # Cancelled by unplace already, and forgotten once squeue no longer lists them.
            self._cancelled &= {j.leader for j in ours}
            keep = {a.job_id for a in self._allocs.values()} | self._cancelled
        self._cancel_orphans(ours, keep)

    def _compare(
        self,
        now: float,
        nodes: Mapping[str, SlurmNode],
        jobs: Sequence[SlurmJob],
        before: Mapping[str, Allocation],
    ) -> None:
        """Turn what Slurm says into events (caller holds the lock)."""
        lost_nodes = set()
        for engine_name, slurm_name in sorted(self._slurm_name.items()):
            sn = nodes.get(slurm_name)
            if sn is not None and sn.state == "unknown" and "NOT_RESPONDING" not in sn.flags:
                # A restarted slurmctld lists its idle nodes as unknown until their slurmd
                # registers again (seconds): no news, not a loss. A node that does not come
                # back is flagged NOT_RESPONDING after SlurmdTimeout, and is lost then.
                continue
            usable = sn is not None and sn.usable
            st = self._state[engine_name]
            if st is NodeState.DOWN and usable:
                self._state[engine_name] = NodeState.ON
                self._due.append(NodeReady(at=now, node=engine_name))
            elif st is not NodeState.DOWN and not usable:
                why = sn.describe if sn is not None else "gone from the partition"
                log.warning("node %s (%s) is %s", engine_name, slurm_name, why)
                self._state[engine_name] = NodeState.DOWN
                self._due.append(NodeLost(at=now, node=engine_name))
                lost_nodes.add(engine_name)
        by_id = {j.job_id: j for j in jobs}
        for lid in sorted(self._lost_while_down, key=_lease_order):
            self._due.append(LeaseLost(at=now, lease_id=lid, cause=self._lost_while_down[lid]))
            self._forget(lid)
        self._lost_while_down = {}
        for lid in sorted(before, key=_lease_order):
            a = self._allocs.get(lid)
            if a is not before[lid]:
                continue  # released (or lost) while Slurm was being asked
            gone = [by_id.get(c.job_id) for c in a.components]
            if all(j is not None and j.state in _HOLDING for j in gone):
                continue
            if lost_nodes.intersection(self._lease_nodes.get(lid, ())):
                # NodeLost revokes it (and every other lease there); the unplace then
                # cancels what is left of the job.
                continue
            states = sorted({j.state if j is not None else "PURGED" for j in gone} - _HOLDING)
            # COMPLETING hides why (cancelled, failed node...) until the steps are gone;
            # the lease ends now rather than a KillWait later.
            cause = f"slurm job {a.job_id} ended outside the broker ({'/'.join(states)})"
            self._due.append(LeaseLost(at=now, lease_id=lid, cause=cause))
            self._forget(lid)

    def _forget(self, lease_id: str) -> None:
        self._allocs.pop(lease_id, None)
        self._lease_nodes.pop(lease_id, None)

    # -- checks -------------------------------------------------------------------------

    def _known(self, nodes: Iterable[str]) -> tuple[str, ...]:
        return check_nodes(nodes, self._state)

    def _advance(self, now: float) -> None:
        # The actuator's threads may call in a slightly different order than they read the
        # clock: the pool's time is the latest it has been given, never set back.
        self._now = max(self._now, check_clock(now, -math.inf))


def _shape(piece: Mapping[str, float]) -> tuple[int, int, int]:
    """(CPUs, GPUs, MB) to ask Slurm for a piece: at least one CPU, since Slurm runs no step
    on none; whole GPUs; memory only when the piece has some (--mem=0 means all of it)."""
    cpus = max(1, math.ceil(float(piece.get("cpu", 0.0)) - 1e-9))
    gpus = math.ceil(float(piece.get("gpu", 0.0)) - 1e-9)
    mem_mb = math.ceil(float(piece.get("mem_gb", 0.0)) * 1024 - 1e-6)
    return cpus, gpus, mem_mb


def _shape_args(shape: tuple[int, int, int]) -> list[str]:
    cpus, gpus, mem_mb = shape
    out = [f"--cpus-per-task={cpus}"]
    if gpus > 0:
        out.append(f"--gres=gpu:{gpus}")
    if mem_mb > 0:
        out.append(f"--mem={mem_mb}")
    return out


def _lease_order(lease_id: str) -> tuple[int, str]:
    digits = lease_id[1:]
    return (int(digits), lease_id) if digits.isdigit() else (-1, lease_id)


def slurm_env_ok() -> bool:
    """True when Slurm's client commands are on PATH (SLURM_CONF is the caller's business)."""
    from shutil import which

    return all(which(c) for c in ("sinfo", "squeue", "salloc", "scancel")) and bool(
        os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")
    )
