"""What a provider records about its nodes on disk, so that nothing outlives a crashed
head monitor: each provider instance writes one JSON file (its owner process, the
cluster, broker and campaign it serves, and per node the lease, the address, the
raylet's process and what the node was created with); a new provider takes over the
files of owners that are gone: it adopts the nodes that still run on live leases of its
own cluster and broker, and cleans up the rest (stops their raylets, releases their
leases).

One file per instance (not one per cluster) because Ray may build more than one
provider in a process, and two instances must never clean up each other's nodes.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bursar.providers.ray.raylet import Proc, alive, proc_start

__all__ = ["NodeRecord", "NodeStore", "OrphanedStore", "all_records", "orphaned_stores"]


@dataclass(frozen=True)
class NodeRecord:
    node_id: str
    """The provider's node id: the lease id."""
    node_type: str
    ip: str
    tags: Mapping[str, str] = field(default_factory=dict)
    pid: int | None = None
    pid_start: int | None = None
    node_config: Mapping[str, Any] | None = None
    """The node type's ``node_config`` it was created with (None: recorded by an older
    provider, which a new one cannot adopt from)."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """The raylet's resources, as advertised."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The raylet's labels, as advertised."""
    temp_dir: str | None = None
    """The raylet's own Ray temp dir (removed with the node)."""

    @property
    def proc(self) -> Proc | None:
        if self.pid is None or self.pid_start is None:
            return None
        return Proc(self.pid, self.pid_start)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> NodeRecord:
        """A record as written, ignoring what this version does not know."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


class NodeStore:
    """This instance's file, rewritten atomically on every change."""

    def __init__(
        self, state_dir: Path, *, cluster: str = "", broker: str = "", campaign: str = ""
    ) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.dir = state_dir
        self.path = state_dir / f"nodes-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        self.owner = Proc(os.getpid(), proc_start(os.getpid()) or 0)
        self.cluster = cluster
        self.broker = broker
        self.campaign = campaign

    def write(self, records: Mapping[str, NodeRecord]) -> None:
        data = {
            "owner": {"pid": self.owner.pid, "start": self.owner.start},
            "cluster": self.cluster,
            "broker": self.broker,
            "campaign": self.campaign,
            "nodes": {k: asdict(r) for k, r in records.items()},
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class OrphanedStore:
    """The file of a provider whose process is gone, and what it recorded ("" where an
    older provider did not record it)."""

    path: Path
    cluster: str
    broker: str
    campaign: str
    records: list[NodeRecord]


def orphaned_stores(state_dir: Path) -> list[OrphanedStore]:
    """The files in ``state_dir`` whose owner process is gone, with their nodes."""
    out: list[OrphanedStore] = []
    if not state_dir.is_dir():
        return out
    for path in sorted(state_dir.glob("nodes-*.json")):
        data = _read(path)
        if data is None:
            continue
        owner = data.get("owner", {})
        if alive(Proc(int(owner.get("pid", 0)), int(owner.get("start", 0)))):
            continue
        out.append(
            OrphanedStore(
                path,
                str(data.get("cluster", "")),
                str(data.get("broker", "")),
                str(data.get("campaign", "")),
                [NodeRecord.from_json(r) for r in data.get("nodes", {}).values()],
            )
        )
    return out


def all_records(state_dir: Path) -> list[NodeRecord]:
    """Every node recorded in ``state_dir``, live owners or not (for cleanup tools)."""
    out = []
    for path in sorted(state_dir.glob("nodes-*.json")) if state_dir.is_dir() else []:
        data = _read(path)
        if data is not None:
            out.extend(NodeRecord.from_json(r) for r in data.get("nodes", {}).values())
    return out
