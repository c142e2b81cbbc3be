"""Send Ray tasks to the leased nodes of ``examples/ray-cluster.yaml``.

Needs the ray extra: pip install 'bursar-broker[ray]'. In one directory, start the broker
on the packaged demo pool and the Ray head whose autoscaler leases the nodes (the
commands at the top of ``examples/ray-cluster.yaml``):

    bursar serve
    python -m bursar.providers.ray start --head --num-cpus=0 --autoscaling-config=examples/ray-cluster.yaml

then run:

    python examples/ray_driver.py

The tasks ask for the ``bursar_node`` resource, which only the leased nodes carry (the
head has none, and no CPUs): Ray's autoscaler leases nodes for them (up to the YAML's
``max_workers``), each runs on one, and the driver prints which lease each ran on. Idle
nodes are terminated after ``idle_timeout_minutes`` and their leases released. Options:
``--address`` (default $RAY_ADDRESS, else 127.0.0.1:6379, where the head above
listens), ``--tasks``.

The head is on 127.0.0.1, and Ray would turn ``ray.init(address="127.0.0.1:6379")``
into this host's outward address, where nothing listens: ``keep_loopback()`` first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bursar.broker.errors import MissingExtra, require

# Before Ray is imported: without the extra, one line saying how to install it.
try:
    require("ray", "psutil", extra="ray", feature="this example")
except MissingExtra as exc:
    sys.exit(f"error: {exc}")

import ray

from bursar.providers.ray.start import keep_loopback


@ray.remote(num_cpus=1, resources={"bursar_node": 1})
def square(x: int) -> tuple[int, str, str]:
    """``x * x``, and the lease and Ray node it ran on (a leased node's raylet carries
    ``BURSAR_LEASE_ID`` into its workers)."""
    time.sleep(1.0)  # long enough for the autoscaler to want more than one node
    return x * x, os.environ.get("BURSAR_LEASE_ID", ""), ray.get_runtime_context().get_node_id()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "127.0.0.1:6379"))
    ap.add_argument("--tasks", type=int, default=8)
    args = ap.parse_args(argv)

    keep_loopback()
    ray.init(address=args.address, log_to_driver=False)
    try:
        results = ray.get([square.remote(i) for i in range(args.tasks)], timeout=600)
    finally:
        ray.shutdown()
    for i, (sq, lease, node) in enumerate(results):
        print(f"{i}^2 = {sq} on lease {lease} (Ray node {node[:8]})")
    leases = {lease for _, lease, _ in results}
    print(f"{len(results)} tasks on {len(leases)} leased nodes: {', '.join(sorted(leases))}")
    return 0 if all(sq == i * i and lease for i, (sq, lease, _) in enumerate(results)) else 1


if __name__ == "__main__":
    sys.exit(main())
