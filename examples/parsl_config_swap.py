"""A Parsl workflow moved onto Bursar leases by swapping one block of its config.

    .venv/bin/python examples/parsl_config_swap.py                 # both, with a broker in-process
    .venv/bin/python examples/parsl_config_swap.py --local         # LocalProvider only
    .venv/bin/python examples/parsl_config_swap.py --broker 127.0.0.1:50051 \\
        --campaign adaptive-sci --token-file state/tokens.json    # a running `bursar serve`

``local_config()`` and ``bursar_config()`` are the same HighThroughputExecutor config;
only the ``provider=`` block differs. The recommended executor settings for leased
capacity (short heartbeats, retries that do not charge for a lost manager, an error
handler that does not count blocks the broker ended as failures) work with either.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

from bursar.providers.client import read_token_file
from bursar.providers.parsl import (
    HEARTBEAT_PERIOD,
    HEARTBEAT_THRESHOLD,
    RETRIES,
    BursarProvider,
    lease_error_handler,
    lease_retry_handler,
)


def local_config(run_dir: str) -> Config:
    return Config(
        executors=[
            HighThroughputExecutor(
                label="htex",
                address="127.0.0.1",
                max_workers_per_node=4,
                heartbeat_period=HEARTBEAT_PERIOD,
                heartbeat_threshold=HEARTBEAT_THRESHOLD,
                block_error_handler=lease_error_handler,
                # ---- the provider block: LocalProvider -------------------------------
                provider=LocalProvider(
                    init_blocks=1,
                    min_blocks=0,
                    max_blocks=2,
                ),
                # ---------------------------------------------------------------------
            )
        ],
        retries=RETRIES,
        retry_handler=lease_retry_handler,
        strategy_period=1,
        run_dir=run_dir,
    )


def bursar_config(run_dir: str, broker: str, campaign: str, token: str) -> Config:
    return Config(
        executors=[
            HighThroughputExecutor(
                label="htex",
                address="127.0.0.1",
                max_workers_per_node=4,
                heartbeat_period=HEARTBEAT_PERIOD,
                heartbeat_threshold=HEARTBEAT_THRESHOLD,
                block_error_handler=lease_error_handler,
                # ---- the provider block: BursarProvider (each block is one lease) ----
                provider=BursarProvider(
                    broker=broker,
                    campaign=campaign,
                    token=token,
                    resources_per_block={"cpu": 2, "mem_gb": 4},
                    init_blocks=1,
                    min_blocks=0,
                    max_blocks=2,
                    walltime="00:10:00",  # each lease's duration (renewed while it lives)
                ),
                # ---------------------------------------------------------------------
            )
        ],
        retries=RETRIES,
        retry_handler=lease_retry_handler,
        strategy_period=1,
        run_dir=run_dir,
    )


@python_app
def where(i: int) -> str:
    import os
    import time

    time.sleep(0.05)
    return os.environ.get("BURSAR_LEASE_ID", "local")


@python_app
def count(*leases: str) -> dict[str, int]:
    from collections import Counter

    return dict(Counter(leases))


def run(config: Config) -> dict[str, int]:
    dfk = parsl.load(config)
    try:
        t0 = time.monotonic()
        result = count(*[where(i) for i in range(40)]).result()
        print(f"  40 tasks + 1 dependent in {time.monotonic() - t0:.1f} s: {result}")
        return result
    finally:
        dfk.cleanup()
        parsl.clear()
        provider = config.executors[0].provider
        if isinstance(provider, BursarProvider):
            provider.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local", action="store_true", help="run on LocalProvider only")
    ap.add_argument("--broker", help="host:port of a running `bursar serve`")
    ap.add_argument("--campaign", default="sci")
    ap.add_argument(
        "--token-file",
        type=Path,
        help="the campaign's token, or serve's STATE/tokens.json (else $BURSAR_TOKEN)",
    )
    args = ap.parse_args()
    # HTEX starts interchange.py and process_worker_pool.py from PATH.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    with tempfile.TemporaryDirectory(prefix="parsl-swap-") as tmp:
        print("LocalProvider:")
        run(local_config(f"{tmp}/local"))
        if args.local:
            return
        print("BursarProvider:")
        if args.broker:
            token = (
                read_token_file(args.token_file, args.campaign)
                if args.token_file
                else os.environ["BURSAR_TOKEN"]
            )
            run(bursar_config(f"{tmp}/bursar", args.broker, args.campaign, token))
            return
        from bursar.broker.service.local import local_broker

        with local_broker() as b:
            print(f"  (a broker in-process on {b.address})")
            run(bursar_config(f"{tmp}/bursar", b.address, "sci", b.tokens["sci"]))


if __name__ == "__main__":
    main()
