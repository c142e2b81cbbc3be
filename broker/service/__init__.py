"""The gRPC service: ``bursar serve``.

The wire contract is ``protos/bursar/v1/*.proto`` (package ``bursar.v1``, services
``Broker`` and ``Admin``). The pieces, each small:

* ``servicer``: thin servicers, proto in and out, one decorator for what every call shares;
* ``core``: the lease operations on the runtime, on the event loop (clock, waiters);
* ``batcher``: commit batches (every entry not yet committed, and the calls waiting);
* ``watch``: the Watch hub (streams, snapshot, replay from the journal, publish);
* ``opening``: the state directory's lock, the runtime resumed, the tokens;
* ``placing``: the placements an asynchronous actuator (Slurm) is making;
* ``background``: the timer task, the metrics refresh, the WAL checkpoints;
* ``errors``: the one exception → gRPC status table, with google.rpc details;
* ``auth``: campaign tokens (stored hashed) and the admin token;
* ``limits``: per-client request rate and open-stream limits;
* ``convert``: proto ↔ engine values (every outbound proto is built here);
* ``metrics``: Prometheus on a side port;
* ``stalls``: what held the event loop (``BURSAR_STALL_LOG=1``; off by default);
* ``server``: ``create_server``, ``running``, ``serve``; ``cli``: the ``serve`` command.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Running", "ServiceCore", "Settings", "create_server", "running", "serve"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `bursar --help` does not import grpc.
    if name == "ServiceCore":
        from bursar.broker.service.core import ServiceCore

        return ServiceCore
    if name in ("Running", "Settings", "create_server", "running", "serve"):
        from bursar.broker.service import server

        return getattr(server, name)
    raise AttributeError(name)
