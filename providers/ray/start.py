"""``python -m bursar.providers.ray start ...``: Ray's own ``ray start``, except that a
loopback ``--node-ip-address`` stays a loopback address.

Plain ``ray start --node-ip-address=127.0.0.1`` replaces 127.0.0.1 with the host's
outward address, and a Ray node whose address is not ``127.0.0.1`` binds its servers
(the GCS, the raylet's node and object managers, the dashboard agent, the metrics
exporter) to every interface. A cluster whose nodes all run on this host needs neither:
with its address kept at 127.0.0.1, each of those servers binds the loopback address
only. The head and every node the provider starts run this way; all other arguments go
to ``ray start`` unchanged, and without ``--node-ip-address`` the node is on 127.0.0.1.
A driver of such a cluster calls :func:`keep_loopback` before ``ray.init``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bursar.broker.service.server import is_loopback

__all__ = ["LOOPBACK", "keep_loopback", "main", "node_ip_of", "ray_start_argv"]

LOOPBACK = "127.0.0.1"


def node_ip_of(args: Sequence[str]) -> str | None:
    """The ``--node-ip-address`` of a ``ray start`` command line, if any."""
    for i, a in enumerate(args):
        if a.startswith("--node-ip-address="):
            return a.split("=", 1)[1]
        if a == "--node-ip-address" and i + 1 < len(args):
            return args[i + 1]
    return None


def ray_start_argv(args: Sequence[str]) -> list[str]:
    """``ray start``'s arguments: ``args``, on 127.0.0.1 unless they name an address."""
    return list(args) if node_ip_of(args) is not None else [f"--node-ip-address={LOOPBACK}", *args]


def keep_loopback() -> None:
    """Make Ray keep loopback addresses in this process: ``ray start``'s
    ``--node-ip-address`` here, and in a driver the address ``ray.init`` is given (Ray
    turns ``ray.init(address="127.0.0.1:6379")`` into the host's outward address, where a
    head started by :func:`main` does not listen). Idempotent."""
    # Ray resolves both through this module attribute at call time: a loopback address
    # is kept, any other resolved as Ray does.
    import ray._private.services as services

    resolve = services.resolve_ip_for_localhost
    if getattr(resolve, "keeps_loopback", False):
        return

    def keep(host: str) -> str:
        if host == "localhost":
            return LOOPBACK
        return host if is_loopback(host) else resolve(host)

    keep.keeps_loopback = True  # type: ignore[attr-defined]
    services.resolve_ip_for_localhost = keep


def main(args: Sequence[str]) -> int:
    """Run ``ray start ARGS`` in this process (``--block`` blocks here, as it does for
    ``ray start``), keeping a loopback node address."""
    from ray.scripts.scripts import main as ray_main

    keep_loopback()
    sys.argv = ["ray", "start", *ray_start_argv(args)]
    ray_main()
    return 0
