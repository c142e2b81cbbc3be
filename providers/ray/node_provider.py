"""A Ray autoscaler node provider whose worker nodes are Bursar leases.

The cluster YAML names it (see ``examples/ray-cluster.yaml``)::

    provider:
      type: external
      module: bursar.providers.ray.BursarNodeProvider
      broker: 127.0.0.1:50051
      campaign: adaptive-sci
      token_file: state/tokens.json      # what `bursar serve` writes
      lease_duration_s: 600
      use_node_id_as_ip: true            # the nodes share the head's address
      disable_node_updaters: true        # the provider starts the raylets itself
      disable_launch_config_check: true

and it runs in the head's monitor process, under the v1 autoscaler and, wrapped by
Ray's ``NodeProviderAdapter``, under v2 (``RAY_enable_autoscaler_v2=1``). The monitor
reads the YAML as it is, so it must be complete (the example is).

The head is not a lease, but the provider lists it (id ``head_node_id``, default
``head``; type ``head_node_type``; address the monitor's ``--monitor-ip``) because Ray's
v1 autoscaler drops the load metrics of addresses its provider does not list; it is
never terminated, nor launched: ``ray up`` is refused (in ``bootstrap_config``, before
it asks anything) and so is any create call for the head, with the supported command,
``python -m bursar.providers.ray start --head --num-cpus=0 --autoscaling-config=CLUSTER.yaml``
(Ray's ``ray start``, with the head kept on 127.0.0.1: see
:mod:`bursar.providers.ray.start`). Under v2 start the head with
``RAY_CLOUD_INSTANCE_ID=head`` and ``RAY_NODE_TYPE_NAME=head`` in its environment, as
KubeRay does: v2 matches Ray nodes to the provider's by these, and without them it never
launches a worker::

    RAY_enable_autoscaler_v2=1 RAY_CLOUD_INSTANCE_ID=head RAY_NODE_TYPE_NAME=head \
        python -m bursar.providers.ray start --head --num-cpus=0 \
        --autoscaling-config=cluster.yaml

Life cycle of one worker node (one node is one lease; the node id is the lease id)::

    create ──Acquire(size from the node type's resources, non-blocking)──► granted
       │                                    listed in non_terminated_nodes() from here
       └─ Refused(reason, retry_after) ──► LeaseRefused (a NodeLaunchException) with
          the reason and retry-after; the node type's next launches within
          retry-after (at most max_retry_s) are refused at once, without asking
    ACTIVE ──► `ray start --address=HEAD --block` on the head's address, with a Ray
               temp dir and ports of its own, the node type's resources and labels
               ──► up-to-date, is_running()
    renewed renew_margin_s before each expiry while the node lives
    PREEMPT_WARNING ──► tagged bursar-lease-state=PREEMPTING; drained in Ray (GCS
                        DrainNode, reason PREEMPTION, deadline = the revocation): no
                        new tasks land there, those running go on until revoked
    REVOKED / EXPIRED ──► gone from non_terminated_nodes() at once; raylet stopped
                          (before its workers: Ray then counts what a drained node's
                          end kills as a preemption, retried without using max_retries)
    terminate_node(s) ──► gone at once; raylet stopped (SIGTERM, then SIGKILL after
                          stop_grace_s); lease released. Idempotent: unknown or
                          already-terminated nodes are ignored (v2 drains, then
                          terminates, sometimes twice).
    the raylet exits by itself ──► lease released, node gone

Sizes: the node type's ``resources`` in Ray's names map to Bursar dimensions through
``resource_map`` (default ``CPU -> cpu``, ``GPU -> gpu``, ``memory`` bytes ``->
mem_gb``); custom resources (``bursar_node: 1``) are advertised by the raylet only. A
node type's ``node_config`` may instead say ``lease_size: {gpu: 8}`` and override
``lease_duration_s``, ``lease_class``, ``lease_labels`` and add ``ray_start_args``.

Elastic node types (``node_config.elastic: {min: 1, max: 4, work: 3600, deadline:
3600, amdahl: 0.05}``, see :mod:`bursar.providers.elastic`): a node of the type is one
elastic lease of ``min`` to ``max`` units of the type's lease, and every unit is a Ray
node, because nodes are what Ray's autoscaler sees and what its scheduler places on (a
raylet's resources cannot change once it runs). Unit 0 is the node the autoscaler
created (its id is the lease id); unit ``k`` > 0 is listed as node ``<lease id>-u<k>``
of the same type, tagged ``bursar-elastic-of=<lease id>``, with a raylet of its own on
an address of its own (labels ``bursar.io/lease-id`` the lease, ``bursar.io/unit`` k)::

    RESIZED (grown) ──► raylets started for the new units, listed at once
    RESIZE_WARNING ──► the units the new size cannot hold (highest first) are drained
                       in Ray (GCS DrainNode, reason PREEMPTION, deadline = the shrink's),
                       their raylets stopped shortly before the deadline, and they leave
                       non_terminated_nodes(): Ray retries what they still ran without
                       counting it against max_retries, as after a preemption
    RESIZED (shrunk) ──► a unit still up past the deadline is stopped at once
    terminate_node(unit) ──► its raylet stopped; the lease keeps the unit (the broker
                       takes units back, not the holder) until it grows again
    terminate_node(the lease's node), its lease's end ──► every unit goes with it

Count the units in the type's ``max_workers`` (a node type of ``max`` units and ``n``
nodes lists up to ``n x max`` nodes), or the autoscaler terminates the extra ones. Under
autoscaler v2 the unit nodes are adopted as cloud instances of pending launch requests
and may be terminated by its per-type limit (the unit then stays unused until the lease
grows again): elastic node types fit v1 better.

Raylets run on this host (the simulated pool): one per node, in a session of its own,
on the head's address (so on 127.0.0.1, where Ray binds a node's servers to the loopback
address only, when the head is there), each with a Ray temp dir of its own (its sockets:
nodes started at once must not pick the same names) and every port picked by the kernel
as it binds (0 for each of ``ray start``'s ports: no two nodes can be given the same).
Ray's v1 monitor keys its load metrics by node address unless the YAML says
``use_node_id_as_ip: true``, which nodes sharing an address need: ``internal_ip`` then
answers with the node's Ray node id (looked up in the GCS by ``RAY_CLOUD_INSTANCE_ID``).
``node_ip_range`` instead gives each node a loopback address of its own (Ray then binds
its servers to every interface). When the broker runs on Slurm (``bursar serve --backend
slurm``), a lease is an allocation and its raylet runs as a step of it (``srun
--jobid=N --overlap``), ended by Slurm with the lease; its address is still a loopback
one, so this works for a cluster whose nodes are this host (the test cluster) only. Each raylet's environment holds ``BURSAR_LEASE_ID``,
``BURSAR_CAMPAIGN``, ``BURSAR_BROKER``, ``RAY_CLOUD_INSTANCE_ID`` (the node id) and
``RAY_NODE_TYPE_NAME``; its Ray labels ``bursar.io/lease-id``,
``bursar.io/lease-duration-s`` and ``bursar.io/campaign``.

A reclaimed lease costs its tasks no retry (they must still allow one: Ray retries
nothing with ``max_retries=0``); an *expired* one (renewal refused, no warning) costs
one each, so on pools where renewals may be refused use ``max_retries=-1`` or
checkpoint, and read the lease duration from the node label.

Each node's life is a :class:`bursar.providers.block.Block` (on a loop thread of the
provider's, driven by the lease's Watch events); this module translates it to Ray's
``NodeProvider``. A node whose creation fails after its lease was granted is never left
behind: its block is cancelled (the lease released), and :meth:`close` releases every
lease the provider holds, listed or not. It runs when the monitor's process stops: at
interpreter exit, and on SIGTERM (``ray stop``), which v1's monitor turns into an exit
itself and for which a handler that does the same is installed in v2's (where SIGTERM
would kill without running exit handlers). A SIGKILL leaves the leases to the next start.

What the provider knows is written to ``state_dir`` on every change. A new provider (a
restarted monitor) adopts what a dead one of the same cluster, broker and campaign left
running (``adopt_nodes``, on by default)::

    recorded node, raylet alive (PID + start time), lease live with this cluster's and
    the node type's labels ──► adopted: Block.adopt (RUNNING at once), the lease taken
        over by AsyncBrokerClient.adopted_lease (GetLease, Renew; no Acquire), listed
        with its tags and address, its raylet watched through a pidfd; from then on a
        node like any other (renewed, drained, terminated, released)
    anything else (lease ended or unknown, raylet gone, another cluster, broker or
    campaign, a record without its node_config, an elastic node, adoption off)
        ──► cleaned up: its processes stopped, its lease released (not a lease of
            another broker's), one WARNING line saying why
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    TAG_RAY_LAUNCH_REQUEST,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from bursar.broker.clock import SYSTEM, Clock
from bursar.cli.console import human_duration
from bursar.providers.block import (
    Block,
    Cause,
    Hooks,
    Input,
    LeaseSpec,
    LoopThread,
    ProcessTree,
    Retry,
    State,
    in_thread,
)
from bursar.providers.client import (
    AsyncBrokerClient,
    BursarClientError,
    Lease,
    NotFound,
    Refused,
)
from bursar.providers.elastic import units_in
from bursar.providers.ray.raylet import (
    NODE_ENV,
    Proc,
    alive,
    proc_start,
    start_node,
    stop_node,
)
from bursar.providers.ray.settings import (
    SHARED_ADDRESS_PROBLEM,
    NodeSettings,
    ProviderSettings,
    SettingsError,
    lease_size,
    node_ip,
    node_settings,
    parse_settings,
    raylet_labels,
    raylet_resources,
)
from bursar.providers.ray.store import NodeRecord, NodeStore, OrphanedStore, orphaned_stores

__all__ = [
    "HEAD_COMMAND",
    "TAG_ELASTIC_OF",
    "TAG_LEASE_STATE",
    "BursarNodeProvider",
    "LeaseRefused",
    "Resize",
    "head_refusal",
]

log = logging.getLogger("bursar.providers.ray")

TAG_LEASE_STATE = "bursar-lease-state"
"""Node tag: the lease's state as last seen (``ACTIVE``, ``PREEMPTING``, ...)."""

TAG_ELASTIC_OF = "bursar-elastic-of"
"""Node tag of an elastic lease's extra unit: the node (the lease) it is a unit of."""

_ENDED_KEPT = 1000

HEAD_COMMAND = (
    "python -m bursar.providers.ray start --head --num-cpus=0 --autoscaling-config={yaml}"
)
"""The supported way to start a cluster whose workers are leases (examples/)."""


def _ray_up_yaml(argv: list[str]) -> str | None:
    """The cluster YAML of a ``ray up CLUSTER.yaml`` command line, else None (also for
    ``ray up`` without one: then ``""``)."""
    if len(argv) < 2 or argv[1] != "up":
        return None
    prog = os.path.basename(argv[0])
    if prog != "ray" and not argv[0].endswith(os.path.join("ray", "scripts", "scripts.py")):
        return None
    return next((a for a in argv[2:] if not a.startswith("-")), "")


def head_refusal(argv: list[str] | None = None) -> str:
    """Why the provider launches no head, and what to run instead: one line, naming the
    cluster YAML of a ``ray up`` command line when there is one."""
    yaml_path = _ray_up_yaml(list(sys.argv if argv is None else argv)) or "CLUSTER.yaml"
    return (
        "the Bursar node provider leases worker nodes only, so the head cannot be "
        "launched (`ray up`): start the head on this host with "
        f"`{HEAD_COMMAND.format(yaml=yaml_path)}`; its monitor then leases the workers"
    )


_LIVE: set[BursarNodeProvider] = set()
"""Providers not closed yet: their leases are released when the process stops (held
strongly: one dropped without close() still holds leases)."""

_hooked = False


def _stop_all() -> None:
    for p in list(_LIVE):
        try:
            p.close()
        except Exception:  # the others still get theirs released
            log.exception("releasing the leases of %r at exit failed", p)


def _on_sigterm(signum: int, frame: Any) -> None:
    # Unwind the main thread (its locks released), then atexit releases the leases: what
    # the v1 monitor's own handler does with its sys.exit.
    sys.exit(128 + signum)


def _hook_process_stop() -> None:
    """Release every live provider's leases when this process stops: at interpreter exit,
    and on SIGTERM (``ray stop`` sends it to the monitor). Ray's v1 monitor handles
    SIGTERM with ``sys.exit``, which runs atexit; the v2 monitor leaves SIGTERM's default,
    which kills without it, so there a handler that exits the same way is installed."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    atexit.register(_stop_all)
    # Only in Ray's monitor: another host process (a test runner, a tool) keeps its own
    # SIGTERM behaviour and calls close() itself.
    prog = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    monitor = prog.name == "monitor.py" and "autoscaler" in prog.parts
    main = threading.current_thread() is threading.main_thread()
    if monitor and main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


@dataclass(frozen=True)
class Resize:
    """One shrink of an elastic node, as it went: to ``units`` by ``deadline`` (clock
    time), the unit nodes drained in Ray and stopped (``stopped``), and when it was done."""

    units: int
    deadline: float | None
    stopped: list[str]
    done_at: float


class LeaseRefused(NodeLaunchException):
    """The broker refused the lease a node needed: ``reason`` (``POOL_FULL``,
    ``ABOVE_BURST``, ``BUCKET_EMPTY``, ...) and ``retry_after`` (seconds; ``inf`` when the
    broker gave none), as Ray's launch exception (its ``category`` is the reason)."""

    def __init__(
        self,
        reason: str,
        description: str,
        retry_after: float,
        src_exc_info: Any = None,
    ) -> None:
        super().__init__(reason or "REFUSED", description, src_exc_info)
        self.reason = reason
        self.retry_after = retry_after

    def __reduce__(self) -> Any:
        return (self.__class__, (self.reason, self.description, self.retry_after, None))


class _Node(Hooks):
    """One worker node: its block (the lease and the raylet's process tree) and what Ray
    is told about it (tags, address)."""

    def __init__(
        self,
        provider: BursarNodeProvider,
        node_type: str,
        ip: str,
        tags: dict[str, str],
        resources: dict[str, float],
        labels: dict[str, str],
        settings: NodeSettings,
        spec: LeaseSpec,
        node_config: Mapping[str, Any],
    ) -> None:
        self.provider = provider
        self.node_id = ""
        """The lease id, once granted."""
        self.node_type = node_type
        self.ip = ip
        self.tags = tags
        self.resources = resources
        self.labels = labels
        self.settings = settings
        self.node_config = dict(node_config)
        """What the node type's ``node_config`` said (recorded: a new provider adopting
        the node rebuilds its settings from it)."""
        self.proc: Proc | None = None
        self.started_at: float | None = None
        """Monotonic time the raylet was started (for an adopted node: adopted)."""
        self.temp_dir: str | None = None
        """The raylet's own Ray temp dir (removed when the node ends)."""
        self.terminating = False
        self.end = ""
        """Why the node ended (for the log and :meth:`BursarNodeProvider.ended_nodes`)."""
        self.units: dict[int, _Unit] = {}
        """An elastic node's other units with a raylet, by unit number (this node is 0)."""
        self.resizes: list[Resize] = []
        """An elastic node's shrinks, oldest first."""
        self.unit_counts: list[int] = []
        """An elastic node's units with a raylet, after each change, oldest first."""
        # Ray's autoscaler retries a refused launch itself: one request per node.
        self.block = Block(
            f"{node_type}@{ip}", provider._client, spec, self, retry=Retry(refusals=False)
        )

    @property
    def gone(self) -> bool:
        b = self.block
        return self.terminating or b.lease_ended or b.state in (State.STOPPING, *_OVER)

    @property
    def tree(self) -> ProcessTree | None:
        return self.block.workers

    def record(self) -> NodeRecord:
        return NodeRecord(
            self.node_id,
            self.node_type,
            self.ip,
            dict(self.tags),
            self.proc.pid if self.proc else None,
            self.proc.start if self.proc else None,
            node_config=self.node_config,
            resources=dict(self.resources),
            labels=dict(self.labels),
            temp_dir=self.temp_dir,
        )

    # ------------------------------------------------------------------ the block's hooks

    def changed(self, block: Block, old: State, inp: Input) -> None:
        p = self.provider
        if inp in (Input.GRANTED, Input.ADOPTED):
            p._listed(self)
        lease = block.lease
        if lease is not None and self.tags.get(TAG_LEASE_STATE) != lease.state.value:
            with p._lock:
                self.tags[TAG_LEASE_STATE] = lease.state.value
            if lease.state.value == "PREEMPTING":
                log.warning(
                    "node %s: the broker will reclaim its lease at %s",
                    self.node_id,
                    block.handle and block.handle.preempt_deadline,
                )
        if block.state is State.STOPPING and old is not State.STOPPING:
            self._say_why(block, inp)
        if block.state.terminal:
            p._forget(self)

    def _say_why(self, block: Block, inp: Input) -> None:
        if inp is Input.LEASE_ENDED:  # also after a preemption warning
            ev = block.end_event
            why = (ev.cause or ev.lease.end_cause) if ev is not None else ""
            kind = ev.kind.value.lower() if ev is not None else ""
            what = kind if kind in ("revoked", "expired") else "ended"
            self.end = f"{what}: {why}" if why else what
            log.warning("node %s: lease %s; stopping its raylet", self.node_id, self.end)
        elif inp is Input.CANCEL:
            self.end = self.end or "terminated"
        elif inp is Input.WORKERS_EXITED:
            # An adopted raylet is not our child: its exit status is not ours to read.
            rc = block.returncode
            self.end = "raylet exited" if rc is None else f"raylet exited with {rc}"
            log.warning("node %s: %s; releasing its lease", self.node_id, self.end)
        elif inp is Input.ERROR:
            self.end = f"provider error: {block.error!r}"

    async def start_workers(self, block: Block, lease: Lease) -> ProcessTree:
        tree = self.provider._start_raylet(self, lease)
        if self.settings.elastic is not None:
            await self._grow_to(units_in(block.spec.size, block.usable), lease)
        return tree

    async def _grow_to(self, n: int, lease: Lease) -> None:
        """Raylets on units 0 to n - 1; one on a unit the lease no longer holds (a
        shrink that did not finish in time) stops at once."""
        p = self.provider
        for k in range(1, n):
            if k not in self.units and not self.gone:
                p._start_unit(self, k, lease)
        for k in [k for k in self.units if k >= n]:
            await in_thread(p._stop_unit, self.units[k], 0.0, "resized away")
        self._count()

    def _count(self) -> None:
        n = 1 + len(self.units)
        if not self.unit_counts or self.unit_counts[-1] != n:
            self.unit_counts.append(n)
            log.info("node %s: %d units with a raylet", self.node_id, n)

    async def resize(
        self,
        block: Block,
        lease: Lease,
        warned_to: Mapping[str, float],
        deadline: float | None,
    ) -> None:
        p, clock = self.provider, block.clock
        n = units_in(block.spec.size, warned_to)
        going = [self.units[k] for k in sorted(self.units, reverse=True) if k >= max(n, 1)]
        if not going:
            return
        now = clock.now()
        left = max(0.2, (deadline if deadline is not None else now + p.settings.stop_grace_s) - now)
        if p.settings.drain_on_preempt:
            for u in going:
                await in_thread(p._drain, u, deadline, f"shrinks to {n} units")
        # Drained: no new task lands on them; what runs has until shortly before the
        # deadline, then the raylets stop (raylet first: Ray counts it a preemption).
        grace = min(p.settings.stop_grace_s, left * 0.2)
        await clock.sleep_until(now + max(0.0, left - 2.5 * grace - 0.1))
        await asyncio.gather(*(in_thread(p._stop_unit, u, grace, "resized away") for u in going))
        self.resizes.append(Resize(n, deadline, [u.node_id for u in going], clock.now()))
        self._count()

    async def resized(self, block: Block, lease: Lease) -> None:
        await self._grow_to(units_in(block.spec.size, block.usable), lease)

    async def drain(self, block: Block, deadline: float | None) -> None:
        # Tell Ray (off the loop: the GCS call blocks), then run on until the lease is
        # revoked: the block ends the drain when the lease ends or the node is terminated.
        if self.tree is not None and self.provider.settings.drain_on_preempt:
            await in_thread(self.provider._drain, self)
        await asyncio.Event().wait()

    async def stop_workers(self, block: Block, workers: ProcessTree, grace_s: float) -> None:
        p = self.provider
        units = list(self.units.values())
        await asyncio.gather(
            in_thread(stop_node, workers, grace_s),
            *(in_thread(p._stop_unit, u, grace_s, self.end or "its lease ended") for u in units),
        )

    def stop_grace(self, block: Block) -> float:
        return self.provider.settings.stop_grace_s


class _Unit:
    """Unit ``k`` > 0 of an elastic node's lease: a Ray node of the node's type with a
    raylet of its own, listed as ``<lease id>-u<k>``; it lives no longer than its node."""

    def __init__(self, parent: _Node, k: int, ip: str) -> None:
        self.parent = parent
        self.k = k
        self.node_id = f"{parent.node_id}-u{k}"
        self.node_type = parent.node_type
        self.ip = ip
        # Not the parent's launch request: no request of the autoscaler's launched it.
        self.tags = {
            **{k: v for k, v in parent.tags.items() if k != TAG_RAY_LAUNCH_REQUEST},
            TAG_ELASTIC_OF: parent.node_id,
        }
        self.resources = parent.resources
        self.labels = raylet_labels({**parent.labels, "bursar.io/unit": str(k)})
        self.settings = parent.settings
        self.proc: Proc | None = None
        self.started_at: float | None = None
        self.tree: ProcessTree | None = None
        self.temp_dir: str | None = None
        """The raylet's own Ray temp dir (removed when it stops)."""
        self.terminating = False
        self.end = ""

    @property
    def gone(self) -> bool:
        return self.terminating or self.parent.gone

    def record(self) -> NodeRecord:
        return NodeRecord(
            self.node_id,
            self.node_type,
            self.ip,
            dict(self.tags),
            self.proc.pid if self.proc else None,
            self.proc.start if self.proc else None,
            temp_dir=self.temp_dir,
        )


_OVER = (State.ENDED, State.FAILED)


class BursarNodeProvider(NodeProvider):
    """Ray worker nodes as Bursar leases (see the module docstring). Thread-safe: the
    autoscaler's launcher threads call :meth:`create_node_with_resources_and_labels`
    concurrently with its update loop."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self.settings: ProviderSettings = parse_settings(
            provider_config, cluster_name, argv=list(sys.argv)
        )
        s = self.settings
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node | _Unit] = {}
        self._ended: OrderedDict[str, tuple[NodeRecord, str]] = OrderedDict()
        self._next_ip = 0
        self._refused: dict[str, tuple[float, LeaseRefused]] = {}
        """Node type -> (until when, on ``clock``, a refused type is not asked again; why)."""
        self.clock: Clock = SYSTEM
        """The refusal cool-down's clock (a test hands it a ManualClock)."""
        self._reserved: set[str] = set()
        """Addresses of nodes whose lease is being asked for."""
        self._blocks: set[_Node] = set()
        """Every node whose block has not ended, listed or not (close() ends them all)."""
        self._loop = LoopThread(f"bursar-ray {cluster_name}")
        self._client = AsyncBrokerClient(s.broker, s.token, campaign=s.campaign)
        self._store = NodeStore(
            s.state_dir, cluster=cluster_name, broker=s.broker, campaign=s.campaign or ""
        )
        self._closed = False
        self._gcs: Any = None
        self._ray_ids: dict[str, str] = {}
        """Provider node id -> Ray node id (hex) of the nodes alive in Ray, as last asked."""
        self._ray_ids_at = float("-inf")
        # The head is not a lease, but Ray's autoscaler expects its provider to list it
        # (v1 drops the load metrics of addresses the provider does not list).
        self._head_id = s.head_node_id if s.head_ip is not None else None
        self._head_tags = {
            TAG_RAY_NODE_KIND: NODE_KIND_HEAD,
            TAG_RAY_USER_NODE_TYPE: s.head_node_type,
            TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE,
            TAG_RAY_NODE_NAME: s.head_node_id,
        }
        if s.head_ip is not None and s.shares_head_address and not s.use_node_id_as_ip:
            log.warning("ray cluster config: %s", SHARED_ADDRESS_PROBLEM)  # in the monitor
        self._store.write({})
        self._take_over_orphans()
        _hook_process_stop()
        _LIVE.add(self)
        log.info("Bursar node provider for %s: %r", cluster_name, s)

    @staticmethod
    def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
        """Ray's CLI calls this before it builds the provider (``ray up``, ``down``,
        ``exec``, and the v1 monitor's fate-sharing teardown): ``ray up`` is refused here,
        before it asks anything, with the command that starts such a cluster."""
        if _ray_up_yaml(list(sys.argv)) is not None:
            import click  # Ray's CLI is click's: its exception is printed as one line

            raise click.ClickException(head_refusal())
        return cluster_config

    # ------------------------------------------------------------------ queries

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        """The head (when known: in the monitor), then the workers whose lease is live
        and that were not terminated: a revoked or expired lease's node is left out as
        soon as the client has heard of the end."""

        def match(tags: Mapping[str, str]) -> bool:
            return all(tags.get(k) == v for k, v in tag_filters.items())

        with self._lock:
            head = [self._head_id] if self._head_id and match(self._head_tags) else []
            return head + [n.node_id for n in self._nodes.values() if not n.gone and match(n.tags)]

    def is_running(self, node_id: str) -> bool:
        """True once the node's raylet was started on its active lease."""
        if node_id == self._head_id:
            return True
        with self._lock:
            n = self._nodes.get(node_id)
            return n is not None and not n.gone and n.tree is not None

    def is_terminated(self, node_id: str) -> bool:
        if node_id == self._head_id:
            return False
        with self._lock:
            n = self._nodes.get(node_id)
            return n is None or n.gone

    def node_tags(self, node_id: str) -> dict[str, str]:
        """The node's tags (also for a node that ended lately: the autoscaler may ask
        about a node it listed a moment ago)."""
        if node_id == self._head_id:
            return dict(self._head_tags)
        with self._lock:
            n = self._nodes.get(node_id)
            if n is not None:
                return dict(n.tags)
            if node_id in self._ended:
                return dict(self._ended[node_id][0].tags)
        raise KeyError(f"no Bursar node {node_id!r} in this provider")

    def internal_ip(self, node_id: str) -> str:
        """The node's address; with ``use_node_id_as_ip`` (nodes that share the head's
        address) its Ray node id, as Ray's v1 monitor then keys its load metrics, or
        until its raylet has registered, the node id itself."""
        if self.settings.use_node_id_as_ip:
            self._address(node_id)  # KeyError for a node never known
            return self._ray_node_id(node_id) or node_id
        return self._address(node_id)

    def _address(self, node_id: str) -> str:
        """The address the node's raylet runs on."""
        if node_id == self._head_id and self.settings.head_ip is not None:
            return self.settings.head_ip
        with self._lock:
            n = self._nodes.get(node_id)
            if n is not None:
                return n.ip
            if node_id in self._ended:
                return self._ended[node_id][0].ip
        raise KeyError(f"no Bursar node {node_id!r} in this provider")

    def external_ip(self, node_id: str) -> str:
        return self.internal_ip(node_id)

    def _ray_node_id(self, node_id: str) -> str | None:
        """The Ray node id (hex) of the provider's node ``node_id`` (the head's for the
        head), from the GCS: by ``RAY_CLOUD_INSTANCE_ID``, which every raylet started
        here carries. None until it has registered, or when the GCS cannot be asked
        (asked at most once a second: the monitor calls this for every node, often)."""
        with self._lock:
            found = self._ray_ids.get(node_id)
            if found is not None or time.monotonic() < self._ray_ids_at + 1.0:
                return found
            self._ray_ids_at = time.monotonic()
        try:
            from ray._raylet import GcsClient
            from ray.core.generated import gcs_pb2

            if self._gcs is None:
                self._gcs = GcsClient(address=self._head_address())
            ids: dict[str, str] = {}
            for ray_id, info in self._gcs.get_all_node_info(timeout=2).items():
                if info.state != gcs_pb2.GcsNodeInfo.ALIVE:
                    continue
                if info.is_head_node and self._head_id:
                    ids[self._head_id] = ray_id.hex()
                if info.instance_id:
                    ids.setdefault(info.instance_id, ray_id.hex())
        except Exception as exc:  # no GCS yet, or not reachable: asked again later
            log.debug("could not list Ray's nodes: %r", exc)
            return None
        with self._lock:
            self._ray_ids = ids
            return ids.get(node_id)

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self._lock:
            if node_id == self._head_id:
                self._head_tags.update(tags)
                return
            n = self._nodes.get(node_id)
            if n is None:
                return  # ended meanwhile: nothing to tag
            n.tags.update(tags)
            self._persist()

    # ------------------------------------------------------------------ Bursar's additions

    def lease_id(self, node_id: str) -> str:
        """The node's lease id (the node id itself)."""
        return node_id

    def ended_nodes(self) -> dict[str, str]:
        """Nodes that ended lately, with why (``revoked: reclaimed``, ``terminated``,
        ``expired``, ``raylet exited with 1``), oldest first."""
        with self._lock:
            return {k: why for k, (_, why) in self._ended.items()}

    def raylet_pid(self, node_id: str) -> int | None:
        with self._lock:
            n = self._nodes.get(node_id)
            tree = n.tree if n is not None else None
            return tree.pid if tree is not None else None

    def close(self) -> None:
        """Terminate every node (raylets stopped, leases released: also a lease whose
        node was never listed) and close the client; idempotent. Ray's monitor never
        calls it: it runs when the monitor's process stops (SIGTERM, as ``ray stop``
        sends, or interpreter exit), and tests and tools call it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            nodes = list(self._blocks)
        _LIVE.discard(self)
        held = [n.block.lease_id or n.node_type for n in nodes]
        if held:
            log.info("stopping: releasing %d leases (%s)", len(held), ", ".join(sorted(held)))
        self._end(nodes, "terminated")
        if held:
            log.info(
                "stopped: %s",
                ", ".join(
                    f"{n.block.lease_id or n.node_type} {n.block.final_state}" for n in nodes
                ),
            )
        try:
            self._loop.call(self._client.close(), 10)
        except Exception as exc:  # closing anyway
            log.warning("could not close the broker client: %r", exc)
        self._loop.close()
        self._store.remove()

    # ------------------------------------------------------------------ create

    def create_node(
        self, node_config: dict[str, Any], tags: dict[str, str], count: int
    ) -> dict[str, Any] | None:
        """Without the node type's resources only ``node_config.lease_size`` can size
        the lease; Ray's autoscaler calls :meth:`create_node_with_resources_and_labels`."""
        return self.create_node_with_resources_and_labels(node_config, tags, count, {}, {})

    def create_node_with_resources_and_labels(
        self,
        node_config: dict[str, Any],
        tags: dict[str, str],
        count: int,
        resources: dict[str, float],
        labels: dict[str, str],
    ) -> dict[str, Any] | None:
        """Acquire ``count`` leases (non-blocking) and list a node for each; the raylets
        start when the leases become active. Raises :class:`LeaseRefused` when the broker
        refuses (the nodes created before the refusal stay), and ``NodeLaunchException``
        for a bad node type or an unreachable broker."""
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE, "worker")
        if tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:  # `ray up`, or the SDK's
            raise NodeLaunchException("head node", head_refusal(), None)
        try:
            ns = node_settings(node_type, node_config or {})
            size = dict(
                ns.lease_size or lease_size(node_type, resources, self.settings.resource_map)
            )
        except SettingsError as exc:
            if node_type == self.settings.head_node_type:
                # The head's type sizes no lease (it is not one): say what to run instead.
                raise NodeLaunchException("head node", head_refusal(), None) from exc
            raise NodeLaunchException("bad node type", str(exc), sys.exc_info()) from exc
        with self._lock:
            if self._closed:
                raise NodeLaunchException("closed", "the provider was closed", None)
            held = self._refused.get(node_type)
            now = self.clock.now()
            if held is not None and now < held[0]:
                raise LeaseRefused(
                    held[1].reason,
                    f"{held[1].description} (not asked again yet)",
                    max(0.0, held[0] - now),
                )
        created: dict[str, Any] = {}
        for _ in range(count):
            node = self._acquire(node_type, ns, size, tags, resources, labels, node_config or {})
            created[node.node_id] = {"ip": node.ip, "lease_id": node.node_id}
        return created

    def _acquire(
        self,
        node_type: str,
        ns: NodeSettings,
        size: dict[str, float],
        tags: Mapping[str, str],
        resources: Mapping[str, float],
        labels: Mapping[str, str],
        node_config: Mapping[str, Any],
    ) -> _Node:
        s = self.settings
        spec = self._lease_spec(node_type, ns, size)
        with self._lock:
            # The address first: a node that cannot have one never gets a lease.
            ip = self._allocate_ip()
            self._reserved.add(ip)
            node = _Node(
                self,
                node_type,
                ip,
                {
                    TAG_RAY_NODE_KIND: NODE_KIND_WORKER,
                    **tags,
                    TAG_RAY_USER_NODE_TYPE: node_type,
                },
                raylet_resources(resources),
                dict(labels),
                ns,
                spec,
                node_config,
            )
            self._blocks.add(node)
        b = node.block
        try:
            self._loop.soon(b.start)
            self._loop.call(b.answered.wait())
        except BaseException:
            self._end([node], "creation interrupted")  # the lease, if granted, goes too
            raise
        finally:
            with self._lock:
                self._reserved.discard(ip)
        if b.cause is Cause.REFUSED:
            exc = b.last_error
            assert isinstance(exc, Refused)
            wait = min(max(exc.retry_after, 0.0), s.max_retry_s)
            refused = LeaseRefused(
                exc.reason,
                f"the broker refused a lease of {size} for a {node_type!r} node: "
                f"{exc.reason}: {exc.message}; retry after {human_duration(exc.retry_after)}",
                exc.retry_after,
                (type(exc), exc, exc.__traceback__),
            )
            with self._lock:
                before = self._refused.get(node_type)
                self._refused[node_type] = (self.clock.now() + wait, refused)
            # One INFO line per change of reason for a node type; the rest at DEBUG.
            changed = before is None or before[1].reason != refused.reason
            log.log(logging.INFO if changed else logging.DEBUG, "%s", refused.description)
            raise refused from exc
        if not b.lease_id:
            err = b.error
            raise NodeLaunchException(
                type(err).__name__[:20],
                f"the broker would not lease a {node_type!r} node ({size}): {err}",
                (type(err), err, err.__traceback__) if err is not None else None,
            ) from err
        return node

    def _lease_spec(self, node_type: str, ns: NodeSettings, size: Mapping[str, float]) -> LeaseSpec:
        s = self.settings
        duration = ns.lease_duration_s or s.lease_duration_s
        margin = s.renew_margin_s
        if margin is not None and margin >= duration:
            margin = None  # a node type's shorter lease: the client's default margin
        return LeaseSpec(
            dict(size),
            duration,
            renew_margin_s=margin,
            intent=ns.elastic.intent(size) if ns.elastic is not None else None,
            lease_class=ns.lease_class or s.lease_class,
            labels={
                "engine": "ray",
                "ray_cluster": self.cluster_name[:63],
                "ray_node_type": node_type[:63],
                **s.lease_labels,
                **ns.lease_labels,
            },
        )

    def _listed(self, node: _Node) -> None:
        """The node's lease was granted, or adopted (on the loop): list it under the
        lease id."""
        lease = node.block.lease
        assert lease is not None
        with self._lock:
            node.node_id = lease.id
            node.labels = raylet_labels(
                {
                    **node.labels,
                    "bursar.io/lease-id": lease.id,
                    "bursar.io/lease-duration-s": f"{node.block.spec.duration_s:g}",
                    "bursar.io/campaign": lease.campaign,
                }
            )
            self._refused.pop(node.node_type, None)
            self._nodes[node.node_id] = node
            self._persist()
        if node.block.adopted:
            return  # said by _adopt
        log.info(
            "node %s (%s): lease %s granted on the %s path, %s",
            node.node_id, node.node_type, lease.id, lease.path.value.lower(), dict(lease.size),
        )  # fmt: skip

    def _forget(self, node: _Node) -> None:
        """The node's block ended (on the loop): its processes are stopped."""
        for u in list(node.units.values()):  # stopped with the block's workers
            self._stop_unit(u, 0.0, node.end or "its lease ended")
        if node.temp_dir is not None:
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        with self._lock:
            self._blocks.discard(node)
            if node.node_id and self._nodes.pop(node.node_id, None) is not None:
                self._ended[node.node_id] = (node.record(), node.end or "ended")
                while len(self._ended) > _ENDED_KEPT:
                    self._ended.popitem(last=False)
                self._persist()
        if node.node_id:
            log.info("node %s ended (%s); lease %s", node.node_id, node.end, node.block.final_state)

    def _allocate_ip(self) -> str:
        """The head's address (every node binds to it), or with ``node_ip_range`` the
        next free address of the range, round robin (so that an address is not reused
        while Ray may still hold metrics for its last node)."""
        ips = self.settings.node_ips
        if not ips:
            return node_ip(self.settings)
        used = {n.ip for n in self._nodes.values()} | self._reserved
        for _ in range(len(ips)):
            ip = ips[self._next_ip % len(ips)]
            self._next_ip += 1
            if ip not in used:
                return ip
        raise NodeLaunchException(
            "no address",
            f"all {len(ips)} addresses of provider.node_ip_range are in use: widen it",
            None,
        )

    # ------------------------------------------------------------------ terminate

    def terminate_node(self, node_id: str) -> dict[str, Any] | None:
        return self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> dict[str, Any] | None:
        """Stop the nodes' raylets and release their leases; returns once done (at most
        ``stop_grace_s`` + a few seconds). Unknown or already-ended nodes are ignored."""
        if self._head_id in node_ids:
            log.warning("not terminating the head (%s): it is not a lease", self._head_id)
        with self._lock:
            found = [self._nodes[i] for i in node_ids if i in self._nodes]
        nodes = [n for n in found if isinstance(n, _Node)]
        for u in found:
            if isinstance(u, _Unit):
                self._stop_unit(u, self.settings.stop_grace_s, "terminated")
        self._end(nodes, "terminated")
        return None

    def _end(self, nodes: list[_Node], why: str) -> None:
        for n in nodes:
            n.end = n.end or why
            n.terminating = True
            self._loop.soon(n.block.cancel)

        self._loop.wait_set([n.block.done for n in nodes], self.settings.stop_grace_s + 15.0)

    # ------------------------------------------------------------------ one node

    def _drain(
        self, n: _Node | _Unit, deadline: float | None = None, shrink: str | None = None
    ) -> None:
        """Tell Ray the node is being preempted (GCS DrainNode, reason PREEMPTION, with
        the lease's revocation time, or a shrink's ``deadline``, as the deadline): no new
        task is placed on it, its running tasks go on, and when it stops Ray reports a
        preemption. Best effort: the node stops at the deadline whatever Ray answers."""
        try:
            from ray._raylet import GcsClient
            from ray.core.generated import autoscaler_pb2, gcs_pb2

            if self._gcs is None:
                self._gcs = GcsClient(address=self._head_address())
            if isinstance(n, _Node) and shrink is None:
                deadline = n.block.handle.preempt_deadline if n.block.handle else None
                message = f"Bursar lease {n.node_id} is being reclaimed by the broker"
            else:
                lease = n.parent.node_id if isinstance(n, _Unit) else n.node_id
                message = f"Bursar lease {lease} {shrink}: node {n.node_id} goes"
            for ray_id, info in self._gcs.get_all_node_info(timeout=5).items():
                if info.instance_id != n.node_id or info.state != gcs_pb2.GcsNodeInfo.ALIVE:
                    continue
                accepted, why = self._gcs.drain_node(
                    ray_id.hex(),
                    autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                    message,
                    int(deadline * 1000) if deadline else 0,
                )
                log.info("node %s: drain for preemption accepted=%s %s", n.node_id, accepted, why)
        except Exception as exc:  # GCS unreachable, an older Ray: the revocation still stops it
            log.warning("node %s: could not drain it in Ray: %r", n.node_id, exc)

    def _head_address(self) -> str:
        head = self.settings.head_address
        if head is None:
            raise SettingsError(
                "ray cluster config: provider.head_address: not set, and this process "
                "was not started with --gcs-address (it is not the head's monitor): set "
                "it to the head's host:port"
            )
        return head

    def _start_unit(self, parent: _Node, k: int, lease: Lease) -> _Unit:
        """Start unit ``k`` of ``parent``'s elastic lease as a Ray node, listed at once."""
        with self._lock:
            u = _Unit(parent, k, self._allocate_ip())
            parent.units[k] = u
            self._nodes[u.node_id] = u
        u.tree = self._start_raylet(u, lease)
        return u

    def _stop_unit(self, u: _Unit, grace_s: float, why: str) -> None:
        """Stop a unit's raylet (raylet first) and unlist it; idempotent."""
        with self._lock:
            u.terminating = True
            u.end = u.end or why
        if u.tree is not None:
            stop_node(u.tree, grace_s)
        if u.temp_dir is not None:
            shutil.rmtree(u.temp_dir, ignore_errors=True)
        with self._lock:
            if u.parent.units.get(u.k) is u:
                del u.parent.units[u.k]
            if self._nodes.pop(u.node_id, None) is not None:
                self._ended[u.node_id] = (u.record(), u.end)
                while len(self._ended) > _ENDED_KEPT:
                    self._ended.popitem(last=False)
                self._persist()
        log.info("node %s (a unit of %s) stopped: %s", u.node_id, u.parent.node_id, u.end)

    def _start_raylet(self, n: _Node | _Unit, lease: Lease) -> ProcessTree:
        s = self.settings
        log_path = Path(s.state_dir) / "logs" / f"{n.node_id}.log"
        popen = start_node(
            node_id=n.node_id,
            node_type=n.node_type,
            head_address=self._head_address(),
            ip=n.ip,
            resources=n.resources,
            labels=n.labels,
            env={
                "BURSAR_LEASE_ID": lease.id,
                "BURSAR_LEASE_NODES": ",".join(lease.nodes),
                "BURSAR_CAMPAIGN": lease.campaign,
                "BURSAR_BROKER": s.broker,
            },
            object_store_memory=s.object_store_memory,
            extra_args=[*s.ray_start_args, *n.settings.ray_start_args, *self._own_temp_dir(n)],
            log_path=log_path,
            command=s.node_command,
            allocation=lease.allocation,
        )
        with self._lock:
            n.proc = Proc(popen.pid, proc_start(popen.pid) or 0)
            n.started_at = time.monotonic()
            n.tags[TAG_RAY_NODE_STATUS] = STATUS_UP_TO_DATE
            self._persist()
        log.info("node %s: raylet started on %s (pid %d)", n.node_id, n.ip, popen.pid)
        return ProcessTree(popen, marker=f"{NODE_ENV}={n.node_id}")

    def _own_temp_dir(self, n: _Node | _Unit) -> list[str]:
        """Every local raylet gets a Ray temp dir of its own: nodes start together (the
        autoscaler launches several at once, an elastic lease's units start with their
        node), and two `ray start` on one host sharing the head's temp dir can pick the
        same socket names (the later raylet dies: "bind: Address already in use")."""
        if self.settings.node_command is not None:
            return []
        # Short, under /tmp: Ray's unix socket paths inside it must stay under 107 bytes.
        n.temp_dir = tempfile.mkdtemp(prefix="brn-", dir="/tmp")
        return [f"--temp-dir={n.temp_dir}"]

    def _persist(self) -> None:
        self._store.write({k: n.record() for k, n in self._nodes.items()})

    def _take_over_orphans(self) -> None:
        """What providers now gone (a crashed or restarted monitor) left in
        ``state_dir``: each node still running on a live lease of this cluster and
        broker is adopted (listed with its tags, its lease renewed from here on, its
        raylet left running); every other one is cleaned up (its processes stopped, its
        lease released), with one line saying why."""
        s = self.settings
        for orphan in orphaned_stores(s.state_dir):
            why_not = self._not_adoptable(orphan)
            units = [r for r in orphan.records if TAG_ELASTIC_OF in r.tags]
            for r in orphan.records:
                if TAG_ELASTIC_OF in r.tags:
                    continue  # with its lease's node, below
                with self._lock:
                    if r.node_id in self._nodes:
                        continue  # in two files (a crash between writes): adopted already
                why = why_not or self._adopt(r)
                if why:
                    mine = [u for u in units if u.tags.get(TAG_ELASTIC_OF) == r.node_id]
                    self._clean_up(r, mine, why, release=orphan.broker in ("", s.broker))
            parents = {r.node_id for r in orphan.records}
            for u in units:
                if u.tags[TAG_ELASTIC_OF] not in parents:  # its node's record is gone
                    self._clean_up(u, [], "a unit whose node is not recorded", release=False)
            orphan.path.unlink(missing_ok=True)

    def _not_adoptable(self, orphan: OrphanedStore) -> str:
        """Why none of an orphaned file's nodes can be adopted ("" if they may be)."""
        s = self.settings
        if not s.adopt_nodes:
            return "adoption is off (provider.adopt_nodes: false)"
        if not orphan.cluster:
            return "recorded by an older provider, without its cluster"
        if orphan.cluster != self.cluster_name:
            return f"recorded by cluster {orphan.cluster!r}, not {self.cluster_name!r}"
        if orphan.broker != s.broker:
            return f"recorded against broker {orphan.broker}, not {s.broker}"
        if orphan.campaign != (s.campaign or ""):
            return f"recorded for campaign {orphan.campaign!r}, not {s.campaign!r}"
        return ""

    def _adopt(self, r: NodeRecord) -> str:
        """Adopt one node a dead provider left; returns why it cannot be ("" if adopted)."""
        if r.node_config is None:
            return "recorded by an older provider, without its node_config"
        root = r.proc
        if root is None or not alive(root):
            return "its raylet is not running"
        try:
            ns = node_settings(r.node_type, r.node_config)
        except SettingsError as exc:
            return f"its node_config no longer parses: {exc}"
        if ns.elastic is not None:
            return "elastic nodes are not adopted"
        try:
            lease = self._loop.call(self._client.get_lease(r.node_id))
        except NotFound:
            return "the broker has no such lease"
        except BursarClientError as exc:
            return f"the broker could not be asked about it: {exc}"
        if lease.ended:
            cause = f": {lease.end_cause}" if lease.end_cause else ""
            return f"its lease is {lease.state.value.lower()}{cause}"
        for key, want in (("ray_cluster", self.cluster_name[:63]), ("ray_node_type", r.node_type)):
            if lease.labels.get(key) != want[:63]:
                return f"its lease's label {key} is {lease.labels.get(key)!r}, not {want!r}"
        spec = self._lease_spec(r.node_type, ns, lease.size)
        with self._lock:
            node = _Node(
                self,
                r.node_type,
                r.ip,
                dict(r.tags),
                dict(r.resources),
                dict(r.labels),
                ns,
                spec,
                r.node_config,
            )
            node.proc = root
            node.started_at = time.monotonic()
            node.temp_dir = r.temp_dir
            self._blocks.add(node)
        tree = ProcessTree(pid=root.pid, marker=f"{NODE_ENV}={r.node_id}")

        async def take_over() -> None:
            h = self._client.adopted_lease(
                r.node_id, spec.duration_s, renew_margin_s=spec.renew_margin_s
            )
            await h.start()
            node.block.adopt(h, tree)
            await node.block.answered.wait()

        try:
            self._loop.call(take_over())
        except BursarClientError as exc:
            with self._lock:
                self._blocks.discard(node)
            return f"its lease could not be taken over: {exc}"
        log.info(
            "node %s (%s): adopted from a previous provider: lease %s %s, raylet pid %d on %s",
            r.node_id, r.node_type, r.node_id, node.block.lease and node.block.lease.state.value,
            root.pid, r.ip,
        )  # fmt: skip
        return ""

    def _clean_up(self, r: NodeRecord, units: list[NodeRecord], why: str, *, release: bool) -> None:
        """Stop the processes of a node a dead provider left (and of its units), and
        release its lease (``release``: the lease is this broker's)."""
        log.warning("node %s (%s), left by a previous provider: not adopted: %s; cleaning up",
                    r.node_id, r.node_type, why)  # fmt: skip
        for rec in [*units, r]:
            root = rec.proc if rec.proc is not None and alive(rec.proc) else None
            tree = ProcessTree(pid=root.pid if root else None, marker=f"{NODE_ENV}={rec.node_id}")
            procs = tree.members()
            if procs:
                log.warning("stopping %d processes left by node %s", len(procs), rec.node_id)
                stop_node(tree, self.settings.stop_grace_s)
            if rec.temp_dir is not None:
                shutil.rmtree(rec.temp_dir, ignore_errors=True)
        if not release:
            if TAG_ELASTIC_OF not in r.tags:
                log.warning("lease %s is another broker's: left to expire there", r.node_id)
            return
        try:
            final = self._loop.call(self._client.release(r.node_id))
            if final.state.value == "RELEASED":
                log.warning("released lease %s, left by a previous provider", r.node_id)
        except NotFound:
            pass
        except BursarClientError as exc:
            log.warning("could not release lease %s (%s): it expires", r.node_id, exc)
