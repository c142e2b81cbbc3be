"""``bursar leases ...``: list, watch and revoke leases, and ask what an Acquire would get."""

from __future__ import annotations

import sys
from collections.abc import Mapping

import click

from bursar.cli.client import (
    CONTEXT,
    admin_client,
    broker_client,
    campaign_option,
    connection_options,
    options,
    print_json,
    print_json_line,
    print_tables,
    run_call,
)
from bursar.providers.client import Lease, PendingRequest, WhatIfResult
from bursar.providers.client_view import event_line, leases_table, pending_table, whatif_tables

__all__ = ["leases", "parse_labels", "parse_units"]


@click.group("leases", context_settings=CONTEXT)
@campaign_option
@connection_options
def leases() -> None:
    """List and watch leases (a campaign's own, or every campaign's with the admin token),
    and ask what a request would get.

    \b
    Examples:
      bursar leases --token-file state/tokens.json --campaign adaptive-sci list
      bursar leases --admin-token-file state/admin.token watch --json
      bursar leases --token-file state/tokens.json --campaign adaptive-sci whatif --size gpu=8
    """


@leases.command("list", context_settings=CONTEXT)
@click.option(
    "--pending",
    is_flag=True,
    help="List the requests waiting in the queue instead: why each waits, its estimated "
    "wait, its place in the queue and its reservation, if any.",
)
@campaign_option
@connection_options
def leases_list(pending: bool) -> None:
    """Live leases (starting, active, preempting), oldest first; with --pending, the
    queued requests in admission order.

    \b
    Examples:
      bursar leases list --pending          # why is my request waiting, and until when?
      bursar leases list --pending --json   # numbers: seconds, seconds since the epoch
    """
    o = options()

    if pending:

        async def queued() -> tuple[list[PendingRequest], float]:
            async with broker_client(o) as client:
                status = await client.status()
                return await client.list_pending(), status.now

        waiting, now = run_call(queued)
        if o.json:
            print_json([x.to_json() for x in waiting])
        else:
            print_tables(pending_table(waiting, now))
        return

    async def go() -> tuple[list[Lease], float]:
        async with broker_client(o) as client:
            status = await client.status()
            return await client.list_leases(), status.now

    items, now = run_call(go)
    if o.json:
        print_json([x.to_json() for x in items])
    else:
        print_tables(leases_table(items, now))


@leases.command("watch", context_settings=CONTEXT)
@click.argument("lease_ids", nargs=-1, metavar="[LEASE_ID]...")
@click.option(
    "--count",
    type=click.IntRange(min=1),
    help="Stop after this many events.",
)
@click.option(
    "--no-reconnect",
    is_flag=True,
    help="Exit (status 1) if the stream drops, instead of reconnecting with backoff.",
)
@campaign_option
@connection_options
def leases_watch(lease_ids: tuple[str, ...], count: int | None, no_reconnect: bool) -> None:
    """Print what happens to leases as the broker decides it, one line (or JSON object)
    per event: granted, activated, preempt_warning, renewed, revoked, expired, released.

    It opens with the current state of each lease (marked [snapshot]). With LEASE_IDs it
    ends once they have all ended; without, it follows every lease (including new ones)
    until interrupted. If the broker restarts, the watch reconnects and resumes.
    """
    o = options()

    async def go() -> None:
        async with broker_client(o) as check:
            await check.status()  # fail fast on a wrong target or token
        async with broker_client(o, forever=True) as client:
            stream = client.watch(list(lease_ids) or None, reconnect=not no_reconnect)
            seen = 0
            try:
                async for ev in stream:
                    if o.json:
                        print_json_line(ev.to_json())
                    else:
                        click.echo(event_line(ev))
                        sys.stdout.flush()
                    seen += 1
                    if count is not None and seen >= count:
                        break
            finally:
                await stream.aclose()  # type: ignore[attr-defined]

    run_call(go)


@leases.command("revoke", context_settings=CONTEXT)
@click.argument("lease_id")
@click.option(
    "--reason",
    required=True,
    help="Why (1-200 characters): journaled, and shown to the lease's holder on its watch.",
)
@campaign_option
@connection_options
def leases_revoke(lease_id: str, reason: str) -> None:
    """End LEASE_ID at once, as a revocation (admin token only; no grace period).

    The lease's holder sees it REVOKED with the cause "revoked by an administrator:
    REASON"; its resources return to the pool and unused prepaid tokens are refunded.

    \b
    Example:
      bursar leases --admin-token-file state/admin.token revoke L42 --reason "drain node003"
    """
    o = options()

    async def go() -> tuple[Lease, float]:
        async with admin_client(o) as admin:
            ended = await admin.revoke_lease(lease_id, reason)
        return ended, ended.ended_at or 0.0

    ended, now = run_call(go)
    if o.json:
        print_json(ended.to_json())
    else:
        print_tables(leases_table([ended], now))


def parse_units(text: str, param: str) -> dict[str, float]:
    """``gpu=8,cpu=64`` as a size."""
    out: dict[str, float] = {}
    for item in text.split(","):
        dim, eq, value = item.partition("=")
        try:
            if not eq or not dim.strip():
                raise ValueError
            out[dim.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(
                f"{item!r}: expected DIM=UNITS, e.g. gpu=8 (several: gpu=8,cpu=64)",
                param_hint=param,
            ) from None
    return out


def parse_labels(items: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--label")
        out[key] = value
    return out


@leases.command("whatif", context_settings=CONTEXT)
@click.option(
    "--size",
    "sizes",
    multiple=True,
    metavar="DIM=UNITS,...",
    help="Units per placed dimension (gpu, cpu, mem_gb), e.g. gpu=8 or gpu=8,cpu=64; "
    "repeatable. May be left out when --per-node or --exclusive gives the size.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    metavar="SECONDS",
    help="How long the lease would last unless renewed.",
)
@click.option(
    "--no-wait",
    is_flag=True,
    help="Ask as a non-blocking request: refused (with a retry-after) instead of queued "
    "when it cannot be granted now.",
)
@click.option(
    "--class",
    "lease_class",
    type=click.Choice(["interactive", "batch", "opportunistic"], case_sensitive=False),
    help="A lower admission class than the campaign's, for this request.",
)
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Repeatable.")
@click.option(
    "--nodes", type=click.IntRange(min=1), help="Exactly this many pieces, on distinct nodes."
)
@click.option("--per-node", metavar="DIM=UNITS,...", help="Each piece's size (with --nodes).")
@click.option("--exclusive", is_flag=True, help="Whole nodes with nothing else on them.")
@click.option("--cpus-per-gpu", type=click.FloatRange(min=0), help="Cores added per GPU.")
@click.option("--mem-per-gpu", type=click.FloatRange(min=0), help="GB of memory added per GPU.")
@campaign_option
@connection_options
def leases_whatif(
    sizes: tuple[str, ...],
    duration: float,
    no_wait: bool,
    lease_class: str | None,
    labels: tuple[str, ...],
    nodes: int | None,
    per_node: str | None,
    exclusive: bool,
    cpus_per_gpu: float | None,
    mem_per_gpu: float | None,
) -> None:
    """What an Acquire of this size and duration would get if it arrived now, without
    asking for it: the broker decides it on a copy of its state, so nothing is requested,
    held or journaled.

    Prints whether it would be granted (and the lease it would be: its path, nodes and
    start), would queue (why, and the estimated wait) or, with --no-wait, would be
    refused (why, and when to retry), then every decision it would cause: preemption
    warnings to reclaim capacity for it, nodes powered on, the grant itself. A campaign
    token sees its own campaign's decisions only. The answer holds for now: the next
    request, or the clock, may change it.

    \b
    Examples:
      bursar leases --token-file state/tokens.json --campaign adaptive-sci whatif \\
          --size gpu=16 --duration 3600
      bursar leases --admin-token-file state/admin.token --campaign adaptive-sci whatif \\
          --nodes 2 --per-node gpu=8 --duration 600 --no-wait --json
    """
    o = options()
    size: dict[str, float] = {}
    for text in sizes:
        size.update(parse_units(text, "--size"))
    shape: Mapping[str, float] | None = parse_units(per_node, "--per-node") if per_node else None

    async def go() -> WhatIfResult:
        async with broker_client(o) as client:
            return await client.whatif_acquire(
                size,
                duration,
                blocking=not no_wait,
                lease_class=lease_class,
                labels=parse_labels(labels),
                nodes=nodes,
                per_node=shape,
                exclusive=exclusive,
                cpus_per_gpu=cpus_per_gpu,
                mem_per_gpu=mem_per_gpu,
            )

    result = run_call(go)
    if o.json:
        print_json(result.to_json())
        return
    print_tables(*whatif_tables(result))
