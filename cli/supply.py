"""``bursar supply``: the supply signals, once or as a stream of snapshots."""

from __future__ import annotations

import click

from bursar.cli.client import (
    CONTEXT,
    broker_client,
    campaign_option,
    connection_options,
    options,
    print_json,
    print_json_line,
    print_tables,
    run_call,
    stdout_console,
)
from bursar.providers.client import Supply
from bursar.providers.client_view import clock, supply_tables

__all__ = ["supply"]


@click.command("supply", context_settings=CONTEXT)
@click.option(
    "--units",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Also say how soon this many units of --dim are usable on each path.",
)
@click.option("--dim", default="gpu", show_default=True, help="The dimension for --units.")
@click.option("--watch", is_flag=True, help="Print a new snapshot whenever the pool changes.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="With --watch: at most one snapshot per this many seconds.",
)
@click.option(
    "--heartbeat",
    type=click.FloatRange(min=0.05),
    default=30.0,
    show_default=True,
    help="With --watch: a snapshot at least this often, even if nothing changed (s).",
)
@click.option("--count", type=click.IntRange(min=1), help="With --watch: stop after N.")
@campaign_option
@connection_options
def supply(
    units: float, dim: str, watch: bool, interval: float, heartbeat: float, count: int | None
) -> None:
    """Supply signals: warm, reclaimable and cold capacity, the price, and bucket levels
    (your campaign's; every campaign's with the admin token).

    \b
    Examples:
      bursar supply --token-file state/tokens.json --campaign adaptive-sci --units 64
      bursar supply --admin-token-file state/admin.token --watch --json
    """
    o = options()

    def show(s: Supply) -> None:
        if o.json:
            (print_json_line if watch else print_json)(s.to_json())
            return
        if watch and not o.tsv:
            stdout_console().rule(clock(s.at))
        print_tables(*supply_tables(s))

    async def go() -> None:
        if not watch:
            async with broker_client(o) as client:
                show(await client.supply(units, dim))
            return
        async with broker_client(o) as check:
            await check.status()
        async with broker_client(o, forever=True) as client:
            stream = client.watch_supply(
                min_interval_s=interval, max_interval_s=heartbeat, units=units, dim=dim
            )
            try:
                n = 0
                async for s in stream:
                    show(s)
                    n += 1
                    if count is not None and n >= count:
                        break
            finally:
                await stream.aclose()  # type: ignore[attr-defined]

    run_call(go)
