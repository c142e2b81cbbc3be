"""Ray on Bursar leases: an autoscaler node provider whose worker nodes are leases.

Name it in the cluster YAML (``provider: {type: external, module:
bursar.providers.ray.BursarNodeProvider, broker: ..., campaign: ...}``); see
:mod:`bursar.providers.ray.node_provider` for the life cycle and
``examples/ray-cluster.yaml`` for a complete file."""

from bursar.broker.errors import require

require("ray", "psutil", extra="ray", feature="the Ray node provider (bursar.providers.ray)")

# ruff: noqa: E402
from bursar.providers.ray.node_provider import TAG_ELASTIC_OF as TAG_ELASTIC_OF
from bursar.providers.ray.node_provider import TAG_LEASE_STATE as TAG_LEASE_STATE
from bursar.providers.ray.node_provider import BursarNodeProvider as BursarNodeProvider
from bursar.providers.ray.node_provider import LeaseRefused as LeaseRefused
from bursar.providers.ray.settings import ProviderSettings as ProviderSettings
from bursar.providers.ray.settings import SettingsError as SettingsError

__all__ = [
    "TAG_ELASTIC_OF",
    "TAG_LEASE_STATE",
    "BursarNodeProvider",
    "LeaseRefused",
    "ProviderSettings",
    "SettingsError",
]
