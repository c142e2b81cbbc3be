"""The same Dask code on a LocalCluster and on Bursar leases: only the line that makes
the cluster differs.

    .venv/bin/python examples/dask_bursar_cluster.py                # both, broker in-process
    .venv/bin/python examples/dask_bursar_cluster.py --local        # LocalCluster only
    .venv/bin/python examples/dask_bursar_cluster.py --broker 127.0.0.1:50051 \\
        --campaign adaptive-sci --token-file state/tokens.json     # a running `bursar serve`

The one line::

    cluster = LocalCluster(n_workers=0, threads_per_worker=1, memory_limit="1GB", ...)
    cluster = BursarCluster(cores=1, processes=1, memory="1GB", broker=..., campaign=..., token=..., ...)

Everything else (``adapt``, the ``Client``, a dask.array reduction, a futures map) is
shared: :func:`workload`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator

import dask.array as da
from distributed import Client, LocalCluster
from distributed.deploy.cluster import Cluster

from bursar.providers.client import read_token_file
from bursar.providers.dask import BursarCluster

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
def broker_for(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    if args.broker:
        token = read_token_file(args.token_file, args.campaign) if args.token_file else args.token
        yield args.broker, args.campaign, token
        return
    # A broker in this process, for trying the example without `bursar serve`.
    from bursar.broker.service.local import local_broker

    with local_broker() as b:
        yield b.address, "sci", b.tokens["sci"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--local", action="store_true", help="run on a LocalCluster only")
    p.add_argument("--broker", help="host:port of a running broker (default: one in-process)")
    p.add_argument("--campaign", default="sci", help="the campaign to charge (default: sci)")
    p.add_argument("--token", help="the campaign's token")
    p.add_argument(
        "--token-file", help="a file holding the campaign's token, or serve's STATE/tokens.json"
    )
    args = p.parse_args(argv)
    local = run("LocalCluster", local_cluster())
    if args.local:
        return 0
    with broker_for(args) as (broker, campaign, token):
        leased = run("BursarCluster", bursar_cluster(broker, campaign, token))
    same = {k: local[k] for k in ("mean", "sum_of_squares")} == {
        k: leased[k] for k in ("mean", "sum_of_squares")
    }
    print("same results" if same else "RESULTS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
