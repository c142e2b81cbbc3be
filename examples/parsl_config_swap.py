"""A Parsl workflow moved onto Bursar leases by swapping one block of its config.

Needs the parsl extra: pip install 'bursar-broker[parsl]'. In one terminal, start the
broker on the packaged demo pool (it writes the campaigns' tokens to state/tokens.json):

    bursar serve

and in another, in the same directory:

    python examples/parsl_config_swap.py

It runs 40 tasks on a LocalProvider, then the same 40 on a BursarProvider whose blocks are
leases of the demo's ``adaptive-sci`` campaign. Options: ``--target HOST:PORT`` (default
$BURSAR_TARGET, else 127.0.0.1:50051, where ``bursar serve`` listens), ``--campaign``,
``--token-file`` (default state/tokens.json), ``--local`` (LocalProvider only),
``--in-process`` (a broker on the demo pool in this process, no ``bursar serve``).

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

from bursar.broker.errors import MissingExtra, require

# Before Parsl is imported: without the extra, one line saying how to install it.
try:
    require("parsl", "psutil", extra="parsl", feature="this example")
except MissingExtra as exc:
    sys.exit(f"error: {exc}")

import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

from bursar.providers.client import DEFAULT_TARGET, InvalidToken, read_token_file
from bursar.providers.parsl import (
    HEARTBEAT_PERIOD,
    HEARTBEAT_THRESHOLD,
    RETRIES,
    BursarProvider,
    lease_error_handler,
    lease_retry_handler,
)

CAMPAIGN = "adaptive-sci"
"""A campaign of the packaged demo pool (``bursar config show-default``)."""


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local", action="store_true", help="run on LocalProvider only")
    ap.add_argument(
        "--target",
        default=os.environ.get("BURSAR_TARGET") or DEFAULT_TARGET,
        help="host:port of a running `bursar serve` (default: $BURSAR_TARGET, else %(default)s)",
    )
    ap.add_argument("--campaign", default=CAMPAIGN, help="the campaign to lease for (%(default)s)")
    ap.add_argument(
        "--token-file",
        type=Path,
        default=Path("state/tokens.json"),
        help="the campaign's token, or serve's STATE/tokens.json (default: %(default)s)",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="serve the demo pool in this process instead of using `bursar serve`",
    )
    args = ap.parse_args(argv)
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
    # HTEX starts interchange.py and process_worker_pool.py from PATH.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    with tempfile.TemporaryDirectory(prefix="parsl-swap-") as tmp:
        print("LocalProvider:")
        run(local_config(f"{tmp}/local"))
        if args.local:
            return 0
        print("BursarProvider:")
        if token is None:
            from bursar.broker.config import default_config
            from bursar.broker.service.local import local_broker

            with local_broker(config=default_config()) as b:
                print(f"  (a broker on the demo pool in this process, on {b.address})")
                token = b.tokens[args.campaign]
                run(bursar_config(f"{tmp}/bursar", b.address, args.campaign, token))
            return 0
        print(f"  (the broker at {args.target}, campaign {args.campaign})")
        run(bursar_config(f"{tmp}/bursar", args.target, args.campaign, token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
