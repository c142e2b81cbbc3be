"""The same Dask code on a LocalCluster and on Bursar leases: only the line that makes
the cluster differs.

Needs the dask extra: pip install 'bursar-broker[dask]'. In one terminal, start the broker
on the packaged demo pool (it writes the campaigns' tokens to state/tokens.json):

    bursar serve

and in another, in the same directory:

    python examples/dask_bursar_cluster.py

It runs the workload on a LocalCluster, then on a BursarCluster whose jobs are leases of
the demo's ``adaptive-sci`` campaign, and checks that the results agree. Options:
``--target HOST:PORT`` (default $BURSAR_TARGET, else 127.0.0.1:50051, where ``bursar
serve`` listens), ``--campaign``, ``--token-file`` (default state/tokens.json), ``--local``
(LocalCluster only), ``--in-process`` (a broker on the demo pool in this process, no
``bursar serve``).

The one line::

    cluster = LocalCluster(n_workers=0, threads_per_worker=1, memory_limit="1GB", ...)
    cluster = BursarCluster(cores=1, processes=1, memory="1GB", broker=..., campaign=..., token=..., ...)

Everything else (``adapt``, the ``Client``, a dask.array reduction, a futures map) is
shared: :func:`workload`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bursar.broker.errors import MissingExtra, require

# Before Dask is imported: without the extra, one line saying how to install it.
try:
    require("dask", "distributed", "dask_jobqueue", "psutil", extra="dask", feature="this example")
except MissingExtra as exc:
    sys.exit(f"error: {exc}")

import dask.array as da
from distributed import Client, LocalCluster
from distributed.deploy.cluster import Cluster

from bursar.providers.client import DEFAULT_TARGET, InvalidToken, read_token_file
from bursar.providers.dask import BursarCluster

CAMPAIGN = "adaptive-sci"
"""A campaign of the packaged demo pool (``bursar config show-default``)."""

N = 100


def local_cluster() -> Cluster:
    return LocalCluster(n_workers=0, threads_per_worker=1, memory_limit="1GB", dashboard_address=":0")  # fmt: skip


def bursar_cluster(broker: str, campaign: str, token: str) -> Cluster:
    return BursarCluster(cores=1, processes=1, memory="1GB", broker=broker, campaign=campaign, token=token, scheduler_options={"dashboard_address": ":0"})  # fmt: skip


def workload(cluster: Cluster) -> dict[str, float]:
    """Adaptive scaling, a dask.array reduction and a map of N futures."""
    cluster.adapt(minimum=1, maximum=2, interval="200ms", target_duration="1s")
    with Client(cluster) as client:
        x = da.arange(1_000_000, chunks=250_000).reshape(1000, 1000)
        column_means = client.compute((x * 2).mean(axis=0)).result()
        squares = client.gather(client.map(pow, range(N), [2] * N))
        return {
            "mean": float(column_means.mean()),
            "sum_of_squares": float(sum(squares)),
            "workers_seen": float(len(client.scheduler_info()["workers"])),
        }


def run(name: str, cluster: Cluster) -> dict[str, float]:
    t0 = time.perf_counter()
    with cluster:
        out = workload(cluster)
    print(
        f"{name:>13}: {out['mean']:.1f} {out['sum_of_squares']:.0f} ({time.perf_counter() - t0:.1f} s)"
    )
    return out


@contextlib.contextmanager
def broker_for(args: argparse.Namespace, token: str | None) -> Iterator[tuple[str, str, str]]:
    if token is not None:
        yield args.target, args.campaign, token
        return
    # The demo pool served in this process, for trying the example without `bursar serve`.
    from bursar.broker.config import default_config
    from bursar.broker.service.local import local_broker

    with local_broker(config=default_config()) as b:
        yield b.address, args.campaign, b.tokens[args.campaign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--local", action="store_true", help="run on a LocalCluster only")
    p.add_argument(
        "--target",
        default=os.environ.get("BURSAR_TARGET") or DEFAULT_TARGET,
        help="host:port of a running `bursar serve` (default: $BURSAR_TARGET, else %(default)s)",
    )
    p.add_argument("--campaign", default=CAMPAIGN, help="the campaign to lease for (%(default)s)")
    p.add_argument(
        "--token-file",
        type=Path,
        default=Path("state/tokens.json"),
        help="the campaign's token, or serve's STATE/tokens.json (default: %(default)s)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="serve the demo pool in this process instead of using `bursar serve`",
    )
    args = p.parse_args(argv)
    token = None
    if not (args.local or args.in_process):
        # Before anything runs: a missing token is the likeliest first mistake.
        try:
            token = read_token_file(args.token_file, args.campaign)
        except InvalidToken as exc:
            print(
                f"error: {exc}; start `bursar serve` in this directory first (it writes "
                "state/tokens.json), or pass --token-file",
                file=sys.stderr,
            )
            return 2
    local = run("LocalCluster", local_cluster())
    if args.local:
        return 0
    with broker_for(args, token) as (broker, campaign, token):
        leased = run("BursarCluster", bursar_cluster(broker, campaign, token))
    same = {k: local[k] for k in ("mean", "sum_of_squares")} == {
        k: leased[k] for k in ("mean", "sum_of_squares")
    }
    print("same results" if same else "RESULTS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
