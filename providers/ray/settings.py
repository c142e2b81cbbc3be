"""The provider section of a Ray cluster YAML, read and checked once, and the pure
mappings from a Ray node type to a Bursar lease and to a raylet's resources.

Nothing here talks to the broker or starts processes: the node provider does that with
what these functions return.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bursar.providers.client import InvalidToken, check_token, read_token_file
from bursar.providers.elastic import ALLOWED, Elastic

__all__ = [
    "DEFAULT_RESOURCE_MAP",
    "RAY_PROVIDER_KEYS",
    "SHARED_ADDRESS_PROBLEM",
    "NodeSettings",
    "ProviderSettings",
    "SettingsError",
    "lease_size",
    "node_ip",
    "node_settings",
    "parse_settings",
    "raylet_labels",
    "raylet_resources",
]

DEFAULT_RESOURCE_MAP: Mapping[str, str] = {"CPU": "cpu", "GPU": "gpu", "memory": "mem_gb"}
"""Ray resource -> Bursar dimension. Ray counts ``memory`` in bytes, Bursar ``mem_gb``
in GiB; every other mapped resource is taken unit for unit."""

BURSAR_DIMS = ("gpu", "cpu", "mem_gb")
"""The placed dimensions a lease can hold (the metered ones, fs_bw and inference, are
not leased)."""

_GIB = float(2**30)

RAY_PROVIDER_KEYS = frozenset(
    {
        "type",
        "head_ip",
        "module",
        "use_node_id_as_ip",
        "disable_node_updaters",
        "disable_launch_config_check",
        "foreground_node_launch",
        "worker_liveness_check",
        "worker_rpc_drain",
        "use_internal_ips",
        "use_external_head_ip",
        "cache_stopped_nodes",
        "worker_ips",
        "external_head_ip",
    }
)
"""Keys of the provider section that Ray itself reads: accepted and left alone."""

_BURSAR_KEYS = {
    "broker": "host:port of the Bursar broker (required)",
    "campaign": "the campaign the leases are charged to",
    "token": "the campaign's token (prefer token_file or $BURSAR_TOKEN)",
    "token_file": "a file holding the campaign's token",
    "head_address": "host:port of the cluster's GCS (default: the monitor's --gcs-address)",
    "head_node_id": "the head's node id, listed with the workers; under autoscaler v2 start "
    "the head with RAY_CLOUD_INSTANCE_ID set to it (default: head)",
    "head_node_type": "the head's node type (default: head_node_type of the monitor's "
    "--autoscaling-config file, else head)",
    "lease_duration_s": "each lease's duration, renewed while the node lives (default 600)",
    "renew_margin_s": "renew this long before expiry (default: half the duration, <= 60 s)",
    "lease_class": "interactive, batch or opportunistic (default: the campaign's)",
    "lease_labels": "labels added to every lease (a mapping of strings)",
    "resource_map": "Ray resource -> Bursar dimension (default CPU: cpu, GPU: gpu, memory: mem_gb)",
    "node_ip_range": "first-last loopback addresses, one per node's raylet (default: every "
    "node on the head's address; Ray binds a node whose address is not 127.0.0.1 to every "
    "interface)",
    "state_dir": "where the provider records its nodes (default: a directory under the "
    "system's temp dir named for the cluster)",
    "object_store_memory": "each raylet's object store in bytes (default 100000000)",
    "stop_grace_s": "how long a raylet gets after SIGTERM before SIGKILL (default 2)",
    "max_retry_s": "the longest a refusal's retry-after keeps new launches of a node type "
    "from asking the broker again (default 10)",
    "ray_start_args": "extra arguments for every node's `ray start` (a list of strings)",
    "drain_on_preempt": "at a lease's preemption warning, drain its node in Ray as preempted "
    "(true/false, default true)",
    "adopt_nodes": "a restarted monitor takes over the nodes its predecessor left running on "
    "live leases instead of stopping them and releasing their leases (true/false, default "
    "true)",
    "node_command": "a command (list of strings) run for each node instead of `ray start "
    "... --block`, with the node's settings in its environment (BURSAR_RAY_HEAD_ADDRESS, "
    "BURSAR_RAY_NODE_IP, RAY_OVERRIDE_RESOURCES, ...): a site's wrapper (srun, ssh)",
}

_NODE_KEYS = {
    "lease_size": "the lease's size in Bursar dimensions, instead of the mapped resources",
    "lease_duration_s": "this node type's lease duration",
    "lease_class": "this node type's lease class",
    "lease_labels": "labels added to this node type's leases",
    "ray_start_args": "extra `ray start` arguments for this node type",
    "elastic": "an elastic lease of min to max units of this node type's lease, each unit "
    "a Ray node of the type: {min, max, work, deadline, amdahl, value} (see "
    "bursar.providers.elastic)",
}

_LEASE_CLASSES = ("interactive", "batch", "opportunistic")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-_.A-Za-z0-9]{0,61}[A-Za-z0-9])?$")


SHARED_ADDRESS_PROBLEM = (
    "provider.use_node_id_as_ip: must be true: every node runs on the head's address, and "
    "Ray's v1 autoscaler tells nodes apart by address unless it is set (or give each node "
    "an address of its own with provider.node_ip_range)"
)


class SettingsError(ValueError):
    """A bad provider section or node_config: names the key and what is allowed."""


@dataclass(frozen=True)
class ProviderSettings:
    broker: str
    campaign: str | None
    token: str | None
    head_address: str | None
    head_ip: str | None = None
    """The head's Ray address (listed as its internal IP); None outside the monitor."""
    head_node_id: str = "head"
    head_node_type: str = "head"
    lease_duration_s: float = 600.0
    renew_margin_s: float | None = None
    lease_class: str | None = None
    lease_labels: Mapping[str, str] = field(default_factory=dict)
    resource_map: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_RESOURCE_MAP))
    node_ips: tuple[str, ...] = ()
    """One address per node, from ``node_ip_range``; empty: every node on the head's."""
    use_node_id_as_ip: bool = False
    """Ray's key: its v1 monitor keys nodes by Ray node id, not address (nodes that share
    an address need it); ``internal_ip`` then answers with the node's Ray node id."""
    state_dir: Path = Path("/tmp")
    object_store_memory: int = 100_000_000
    stop_grace_s: float = 2.0
    max_retry_s: float = 10.0
    ray_start_args: tuple[str, ...] = ()
    node_command: tuple[str, ...] | None = None
    drain_on_preempt: bool = True
    adopt_nodes: bool = True
    """A new provider adopts the nodes a dead one of its cluster left running."""

    @property
    def shares_head_address(self) -> bool:
        """Every node runs on the head's address (no ``node_ip_range``)."""
        return not self.node_ips

    def __repr__(self) -> str:  # never print the token
        return (
            f"ProviderSettings(broker={self.broker!r}, campaign={self.campaign!r}, "
            f"lease_duration_s={self.lease_duration_s}, lease_class={self.lease_class!r})"
        )


@dataclass(frozen=True)
class NodeSettings:
    """What one node type's ``node_config`` says about its leases and raylets."""

    lease_size: Mapping[str, float] | None = None
    lease_duration_s: float | None = None
    lease_class: str | None = None
    lease_labels: Mapping[str, str] = field(default_factory=dict)
    ray_start_args: tuple[str, ...] = ()
    elastic: Elastic | None = None
    """An elastic node type: one lease of ``min`` to ``max`` units (a Ray node each)."""


def _where(key: str) -> str:
    return f"ray cluster config: provider.{key}"


def _number(section: Mapping[str, Any], key: str, default: float, *, where: str) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingsError(f"{where}: must be a number, got {value!r}")
    if value <= 0:
        raise SettingsError(f"{where}: must be positive, got {value!r}")
    return float(value)


def _strings(value: Any, *, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SettingsError(f"{where}: must be a mapping of strings to strings, got {value!r}")
    return dict(value)


def _args(value: Any, *, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(a, str) for a in value):
        raise SettingsError(f"{where}: must be a list of strings, got {value!r}")
    return tuple(value)


def _lease_class(value: Any, *, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in _LEASE_CLASSES:
        raise SettingsError(
            f"{where}: unknown value {value!r}; allowed: {', '.join(_LEASE_CLASSES)}"
        )
    return value.lower()


def _ip_range(value: Any) -> tuple[str, ...]:
    where = _where("node_ip_range")
    try:
        first, last = (ipaddress.IPv4Address(p.strip()) for p in str(value).split("-"))
    except ValueError as exc:
        raise SettingsError(
            f"{where}: {value!r} is not FIRST-LAST (e.g. 127.0.0.2-127.0.0.254): {exc}"
        ) from None
    if not (first.is_loopback and last.is_loopback) or last < first:
        raise SettingsError(
            f"{where}: {value!r} must be an ascending range of loopback addresses: each "
            "node's raylet runs on this host, one address per node"
        )
    return tuple(str(ipaddress.IPv4Address(i)) for i in range(int(first), int(last) + 1))


def _token(provider: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    if "token" in provider and "token_file" in provider:
        raise SettingsError(f"{_where('token')}: give token or token_file, not both")
    if "token" in provider:
        if not isinstance(provider["token"], str) or not provider["token"]:
            raise SettingsError(f"{_where('token')}: must be a non-empty string")
        return str(provider["token"])
    if "token_file" in provider:
        # A bare token, or the tokens.json that bursar serve writes (the campaign's entry).
        path = Path(os.path.expanduser(str(provider["token_file"])))
        campaign = provider.get("campaign")
        try:
            return read_token_file(path, campaign if isinstance(campaign, str) else None)
        except InvalidToken as exc:
            raise SettingsError(f"{_where('token_file')}: {exc}") from None
    token = env.get("BURSAR_TOKEN") or None
    if token is not None:
        try:
            check_token(token, "$BURSAR_TOKEN")
        except InvalidToken as exc:
            raise SettingsError(str(exc)) from None
    return token


def parse_settings(
    provider: Mapping[str, Any],
    cluster_name: str,
    env: Mapping[str, str] | None = None,
    argv: list[str] | None = None,
) -> ProviderSettings:
    """Read the provider section; raise :class:`SettingsError` naming the key on any
    mistake. ``env`` (default ``os.environ``) may hold ``BURSAR_TOKEN``; ``argv`` (the
    monitor's command line) its ``--gcs-address``, the default ``head_address``."""
    env = os.environ if env is None else env
    unknown = sorted(
        k for k in provider if k not in _BURSAR_KEYS and k not in RAY_PROVIDER_KEYS and k[:1] != "_"
    )
    if unknown:
        allowed = "\n".join(f"  {k}: {v}" for k, v in _BURSAR_KEYS.items())
        raise SettingsError(
            f"{_where(unknown[0])}: unknown key; Bursar's keys are:\n{allowed}\n"
            f"and Ray's: {', '.join(sorted(RAY_PROVIDER_KEYS))}"
        )
    broker = provider.get("broker")
    if not isinstance(broker, str) or ":" not in broker:
        raise SettingsError(
            f"{_where('broker')}: required, the broker's host:port (e.g. 127.0.0.1:50051), "
            f"got {broker!r}"
        )
    campaign = provider.get("campaign")
    if campaign is not None and (not isinstance(campaign, str) or not campaign):
        raise SettingsError(f"{_where('campaign')}: must be a campaign name, got {campaign!r}")
    head = provider.get("head_address") or _arg(argv, "--gcs-address")
    if head is not None and (not isinstance(head, str) or ":" not in head):
        raise SettingsError(f"{_where('head_address')}: must be host:port, got {head!r}")
    duration = _number(provider, "lease_duration_s", 600.0, where=_where("lease_duration_s"))
    margin = None
    if "renew_margin_s" in provider:
        margin = _number(provider, "renew_margin_s", 1.0, where=_where("renew_margin_s"))
        if margin >= duration:
            raise SettingsError(
                f"{_where('renew_margin_s')}: must be below lease_duration_s ({duration:g})"
            )
    rmap = provider.get("resource_map", DEFAULT_RESOURCE_MAP)
    rmap = _strings(rmap, where=_where("resource_map"))
    for ray_name, dim in rmap.items():
        if dim not in BURSAR_DIMS:
            raise SettingsError(
                f"{_where('resource_map')}.{ray_name}: unknown dimension {dim!r}; "
                f"allowed: {', '.join(BURSAR_DIMS)}"
            )
    osm = provider.get("object_store_memory", 100_000_000)
    if isinstance(osm, bool) or not isinstance(osm, int) or osm < 78_643_200:
        raise SettingsError(
            f"{_where('object_store_memory')}: bytes, an integer of at least 78643200 "
            f"(Ray's minimum), got {osm!r}"
        )
    state_dir = provider.get("state_dir")
    if state_dir is None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", cluster_name) or "default"
        state_dir = Path(tempfile.gettempdir()) / f"bursar-ray-{safe}"
    head_ip = provider.get("head_ip") or _arg(argv, "--monitor-ip")
    head_node_id = provider.get("head_node_id", "head")
    if not isinstance(head_node_id, str) or not head_node_id:
        raise SettingsError(f"{_where('head_node_id')}: must be a non-empty string")
    head_type = provider.get("head_node_type") or _head_type_from(
        _arg(argv, "--autoscaling-config")
    )
    if not isinstance(head_type, str):
        raise SettingsError(f"{_where('head_node_type')}: must be a node type's name")
    return ProviderSettings(
        broker=broker,
        campaign=campaign,
        token=_token(provider, env),
        head_address=head,
        head_ip=head_ip,
        head_node_id=head_node_id,
        head_node_type=head_type,
        lease_duration_s=duration,
        renew_margin_s=margin,
        lease_class=_lease_class(provider.get("lease_class"), where=_where("lease_class")),
        lease_labels=_strings(provider.get("lease_labels", {}), where=_where("lease_labels")),
        resource_map=rmap,
        node_ips=_ip_range(provider["node_ip_range"]) if "node_ip_range" in provider else (),
        use_node_id_as_ip=_bool(provider, "use_node_id_as_ip", False),
        state_dir=Path(os.path.expanduser(str(state_dir))),
        object_store_memory=osm,
        stop_grace_s=_number(provider, "stop_grace_s", 2.0, where=_where("stop_grace_s")),
        max_retry_s=_number(provider, "max_retry_s", 10.0, where=_where("max_retry_s")),
        ray_start_args=_args(provider.get("ray_start_args", []), where=_where("ray_start_args")),
        node_command=_command(provider.get("node_command")),
        drain_on_preempt=_bool(provider, "drain_on_preempt", True),
        adopt_nodes=_bool(provider, "adopt_nodes", True),
    )


def node_ip(settings: ProviderSettings) -> str:
    """The address of nodes that share the head's: the host of ``head_address``
    (127.0.0.1 while it is unknown: such a node cannot start anyway)."""
    head = settings.head_address
    if head is None:
        return "127.0.0.1"
    return head.rsplit(":", 1)[0].strip("[]")


def _bool(section: Mapping[str, Any], key: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise SettingsError(f"{_where(key)}: must be true or false, got {value!r}")
    return value


def _command(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    cmd = _args(value, where=_where("node_command"))
    if not cmd:
        raise SettingsError(f"{_where('node_command')}: must not be empty (omit it for ray start)")
    return cmd


def _arg(argv: list[str] | None, name: str) -> str | None:
    """The value of option ``name`` on the monitor's command line (``--gcs-address``,
    ``--monitor-ip``, ``--autoscaling-config``), if any."""
    args = list(argv or [])
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def _head_type_from(path: str | None) -> str:
    """``head_node_type`` of the cluster YAML the monitor reads, else ``head``."""
    if path is None:
        return "head"
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f)
        return str(cfg.get("head_node_type") or "head")
    except (OSError, yaml.YAMLError, AttributeError):
        return "head"


def node_settings(node_type: str, node_config: Mapping[str, Any]) -> NodeSettings:
    """Read a node type's ``node_config`` (unknown keys are an error: the provider
    launches nothing else from it)."""

    def where(key: str) -> str:
        return f"ray cluster config: available_node_types.{node_type}.node_config.{key}"

    unknown = sorted(k for k in node_config if k not in _NODE_KEYS)
    if unknown:
        allowed = "\n".join(f"  {k}: {v}" for k, v in _NODE_KEYS.items())
        raise SettingsError(f"{where(unknown[0])}: unknown key; allowed:\n{allowed}")
    size = None
    if "lease_size" in node_config:
        raw = node_config["lease_size"]
        if not isinstance(raw, Mapping) or not raw:
            raise SettingsError(f"{where('lease_size')}: must be a mapping, e.g. {{gpu: 8}}")
        size = {}
        for dim in raw:
            if dim not in BURSAR_DIMS:
                raise SettingsError(
                    f"{where('lease_size')}.{dim}: unknown dimension; allowed: "
                    f"{', '.join(BURSAR_DIMS)}"
                )
            size[dim] = _number(raw, dim, 1.0, where=f"{where('lease_size')}.{dim}")
    duration = None
    if "lease_duration_s" in node_config:
        duration = _number(node_config, "lease_duration_s", 1.0, where=where("lease_duration_s"))
    elastic = None
    if "elastic" in node_config:
        try:
            elastic = Elastic.parse(node_config["elastic"])
        except ValueError as exc:
            raise SettingsError(f"{where('elastic')}: {exc}; allowed: {ALLOWED}") from None
    return NodeSettings(
        elastic=elastic,
        lease_size=size,
        lease_duration_s=duration,
        lease_class=_lease_class(node_config.get("lease_class"), where=where("lease_class")),
        lease_labels=_strings(node_config.get("lease_labels", {}), where=where("lease_labels")),
        ray_start_args=_args(node_config.get("ray_start_args", []), where=where("ray_start_args")),
    )


def lease_size(
    node_type: str, resources: Mapping[str, float], resource_map: Mapping[str, str]
) -> dict[str, float]:
    """The lease a node of ``resources`` (Ray's names) needs: each mapped resource in
    its Bursar dimension (``memory`` bytes as GiB); unmapped (custom) resources are the
    raylet's business only. A node type that maps to nothing cannot be leased."""
    size: dict[str, float] = {}
    for name, amount in resources.items():
        dim = resource_map.get(name)
        if dim is None or not amount:
            continue
        units = float(amount) / _GIB if name == "memory" else float(amount)
        size[dim] = size.get(dim, 0.0) + units
    if not size:
        raise SettingsError(
            f"ray cluster config: available_node_types.{node_type}.resources: "
            f"{dict(resources)!r} holds none of {sorted(resource_map)} (provider.resource_map), "
            "so there is nothing to lease; add e.g. CPU: 1, or set node_config.lease_size"
        )
    return size


def raylet_resources(resources: Mapping[str, float]) -> dict[str, float]:
    """What the node's raylet advertises: exactly the node type's resources, so that
    the autoscaler's plan matches the node; CPU and GPU are 0 unless declared (a local
    raylet must not claim the host's cores by auto-detection)."""
    out = {"CPU": 0.0, "GPU": 0.0}
    out.update({k: float(v) for k, v in resources.items()})
    return out


def raylet_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Ray node labels, with values Ray would reject made safe (Ray allows letters,
    digits, ``-``, ``_`` and ``.``, at most 63 characters)."""
    out = {}
    for k, v in labels.items():
        v = str(v)
        if not _LABEL_VALUE.fullmatch(v):
            v = re.sub(r"[^-_.A-Za-z0-9]", "-", v).strip("-_.")[:63] or "x"
        out[k] = v
    return out
