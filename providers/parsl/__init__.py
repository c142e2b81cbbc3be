"""Parsl on Bursar leases: swap the provider block of a HighThroughputExecutor config.

See :mod:`bursar.providers.parsl.provider` for the life cycle and the recommended
executor settings."""

from bursar.broker.errors import require

require("parsl", "psutil", extra="parsl", feature="the Parsl provider (bursar.providers.parsl)")

# ruff: noqa: E402
from bursar.providers.parsl.provider import HEARTBEAT_PERIOD as HEARTBEAT_PERIOD
from bursar.providers.parsl.provider import HEARTBEAT_THRESHOLD as HEARTBEAT_THRESHOLD
from bursar.providers.parsl.provider import RETRIES as RETRIES
from bursar.providers.parsl.provider import BursarProvider as BursarProvider
from bursar.providers.parsl.provider import fit_to_warm as fit_to_warm
from bursar.providers.parsl.provider import lease_error_handler as lease_error_handler
from bursar.providers.parsl.provider import lease_retry_handler as lease_retry_handler

__all__ = [
    "HEARTBEAT_PERIOD",
    "HEARTBEAT_THRESHOLD",
    "RETRIES",
    "BursarProvider",
    "fit_to_warm",
    "lease_error_handler",
    "lease_retry_handler",
]
