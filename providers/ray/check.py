"""Check a Ray cluster YAML for BursarNodeProvider before starting a head with it.

    python -m bursar.providers.ray check examples/ray-cluster.yaml [--no-broker]

Ray's monitor reads the file as it is and reports a bad provider section only in its
own log (``monitor.err``) after the head is up; this says what is wrong first: the keys
Ray's autoscaler needs, the provider section (``use_node_id_as_ip: true`` where the
nodes share the head's address), each node type's lease size, and (unless
``--no-broker``) whether the broker answers with the configured token. Exit status 0
when all is well, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from bursar.providers.client import BrokerClient, BursarClientError
from bursar.providers.ray.settings import (
    SHARED_ADDRESS_PROBLEM,
    SettingsError,
    lease_size,
    node_settings,
    parse_settings,
)

__all__ = ["REQUIRED_KEYS", "check", "main"]

REQUIRED_KEYS = (
    "cluster_name",
    "max_workers",
    "idle_timeout_minutes",
    "provider",
    "auth",
    "available_node_types",
    "head_node_type",
    "file_mounts",
    "cluster_synced_files",
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
"""Top-level keys Ray's monitor reads without a default (``ray up`` fills them in; a
head started with ``--autoscaling-config`` does not)."""

MODULE = "bursar.providers.ray.BursarNodeProvider"


def check(path: Path, *, broker: bool = True) -> list[str]:
    """Problems with the cluster YAML at ``path`` (empty: none); prints what it found."""
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"{path}: cannot read it as YAML: {exc}"]
    if not isinstance(cfg, Mapping):
        return [f"{path}: not a mapping of keys"]
    problems = [
        f"{path}: {key}: missing (Ray's monitor needs it; see examples/ray-cluster.yaml)"
        for key in REQUIRED_KEYS
        if key not in cfg
    ]
    provider = cfg.get("provider") or {}
    if provider.get("type") != "external" or provider.get("module") != MODULE:
        problems.append(f"{path}: provider: needs type: external and module: {MODULE}")
    if provider.get("disable_node_updaters") is not True:
        problems.append(
            f"{path}: provider.disable_node_updaters: must be true (else Ray's v1 autoscaler "
            "tries to SSH into the nodes)"
        )
    try:
        settings = parse_settings(provider, str(cfg.get("cluster_name", "")))
    except SettingsError as exc:
        return [*problems, f"{path}: {exc}"]
    if settings.shares_head_address and not settings.use_node_id_as_ip:
        problems.append(f"{path}: {SHARED_ADDRESS_PROBLEM}")
    types: Mapping[str, Any] = cfg.get("available_node_types") or {}
    head = cfg.get("head_node_type")
    if head not in types:
        problems.append(f"{path}: head_node_type: {head!r} is not in available_node_types")
    for name, spec in types.items():
        if name == head:
            continue
        try:
            ns = node_settings(name, spec.get("node_config") or {})
            size = ns.lease_size or lease_size(
                name, spec.get("resources") or {}, settings.resource_map
            )
        except SettingsError as exc:
            problems.append(f"{path}: {exc}")
            continue
        print(f"{name}: each node is a lease of {dict(size)}")
    if broker and not problems:
        try:
            with BrokerClient(
                settings.broker, settings.token, campaign=settings.campaign, retry_timeout_s=5
            ) as client:
                status = client.status()
                leases = client.list_leases()
            print(
                f"broker {settings.broker}: Bursar {status.version}, you are {status.caller}, "
                f"holding {len(leases)} leases"
            )
        except BursarClientError as exc:
            problems.append(f"{path}: provider.broker {settings.broker}: {exc}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bursar.providers.ray",
        description="Tools for Ray clusters on Bursar leases.",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check a cluster YAML (and the broker) before `ray start`")
    c.add_argument("config", type=Path, help="the cluster YAML")
    c.add_argument("--no-broker", action="store_true", help="do not contact the broker")
    args = ap.parse_args(argv)
    problems = check(args.config, broker=not args.no_broker)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{args.config}: ok")
    return 1 if problems else 0
