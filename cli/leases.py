"""``bursar leases ...``: list, watch and revoke leases."""

from __future__ import annotations

import sys

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
    run_call,
    stdout_console,
)
from bursar.providers.client import Lease
from bursar.providers.client_view import event_line, leases_table

__all__ = ["leases"]


@click.group("leases", context_settings=CONTEXT)
@campaign_option
@connection_options
def leases() -> None:
    """List and watch leases (a campaign's own, or every campaign's with the admin token).

    \b
    Examples:
      bursar leases --token-file state/tokens.json --campaign sci list
      bursar leases --admin-token-file state/admin.token watch --json
    """


@leases.command("list", context_settings=CONTEXT)
@campaign_option
@connection_options
def leases_list() -> None:
    """Live leases (starting, active, preempting), oldest first."""
    o = options()

    async def go() -> tuple[list[Lease], float]:
        async with broker_client(o) as client:
            status = await client.status()
            return await client.list_leases(), status.now

    items, now = run_call(go)
    if o.json:
        print_json([x.to_json() for x in items])
    else:
        stdout_console().print(leases_table(items, now))


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
        stdout_console().print(leases_table([ended], now))
