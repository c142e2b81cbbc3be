"""``bursar release``, ``bursar renew`` and ``bursar status``: Slurm-style verbs on one lease
and on the broker, for people at a shell (``scancel``, ``scontrol update``, ``sinfo``).

Times are printed as local wall-clock times with how far off they are ("19:52:04 (in
9m58s)"); ``--json`` prints the raw messages (seconds since the epoch) for machines.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from bursar.cli.client import (
    CONTEXT,
    WOULD_SHORTEN,
    broker_client,
    campaign_option,
    connection_options,
    fail,
    options,
    print_json,
    print_tables,
    run_call,
)
from bursar.cli.console import human_duration, iso_time
from bursar.providers.client import BrokerStatus, FailedPrecondition, Lease
from bursar.providers.client_view import leases_table

__all__ = ["at", "ended_how", "lease_summary", "release_command", "renew_command", "status_command"]


def at(t: float | None, now: float | None = None) -> str:
    """``t`` (seconds since the epoch) as people read it: ISO 8601 in UTC, and, given
    ``now``, how far from it ("2026-12-01T19:52:04.000Z (in 9m58s)")."""
    if not t:
        return "-"
    text = iso_time(t)
    if now is None:
        return text
    d = t - now
    if abs(d) < 0.5:
        return f"{text} (now)"
    span = human_duration(abs(d))
    return f"{text} (in {span})" if d > 0 else f"{text} ({span} ago)"


def _size(size: Any) -> str:
    return ",".join(f"{k}={v:g}" for k, v in sorted(size.items())) or "-"


def ended_how(lease: Lease) -> str:
    """How an ended lease ended: its state, and its cause where that says more
    ("revoked: reclaimed", "expired", not "released: released")."""
    state = lease.state.value.lower()
    cause = lease.end_cause
    return f"{state}: {cause}" if cause and cause != state else state


def lease_summary(lease: Lease, now: float) -> str:
    """One line: the lease, its size, state, nodes and when it expires."""
    state = lease.state.value.lower()
    if lease.ended_at is not None:
        cause = ended_how(lease).removeprefix(state)
        return (
            f"lease {lease.id} ({lease.campaign}): {_size(lease.size)}, {state}; "
            f"ended {at(lease.ended_at, now)}{cause}"
        )
    nodes = ",".join(lease.nodes) or "none yet"
    return (
        f"lease {lease.id} ({lease.campaign}): {_size(lease.size)}, {state}, nodes {nodes}; "
        f"expires {at(lease.expires_at, now)}"
    )


@click.command("release", context_settings=CONTEXT)
@click.argument("lease_id")
@campaign_option
@connection_options
def release_command(lease_id: str) -> None:
    """Release LEASE_ID now: its resources go back to the pool (like scancel).

    \b
    Example:
      bursar release L42 --token-file state/tokens.json --campaign storm
    """
    o = options()

    async def go() -> tuple[Lease, float]:
        async with broker_client(o) as client:
            lease = await client.release(lease_id)
            return lease, (await client.status()).now

    lease, now = run_call(go)
    if o.json:
        print_json(lease.to_json())
    else:
        click.echo(lease_summary(lease, now))


@click.command("renew", context_settings=CONTEXT)
@click.argument("lease_id")
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    metavar="SECONDS",
    help="The lease's new remaining life, counted from now.",
)
@campaign_option
@connection_options
def renew_command(lease_id: str, duration: float) -> None:
    """Extend LEASE_ID to expire DURATION seconds from now (like scontrol update
    TimeLimit). Refused past the campaign's envelope, with the reason and when to retry.

    A renewal never shortens a lease: if it already runs past DURATION from now, nothing
    is sent and the command says until when it runs and exits 1, as scontrol does when
    it cannot set the limit asked for (a script that asked for less learns it got more).

    \b
    Example:
      bursar renew L42 --duration 3600 --token-file state/tokens.json --campaign storm
    """
    o = options()

    async def go() -> tuple[Lease, float, bool]:
        async with broker_client(o) as client:
            current = await client.get_lease(lease_id)
            now = (await client.status()).now
            # Within a second the renewal still moves the end (a little) and is sent.
            if current.live and current.expires_at > now + duration + 1.0:
                return current, now, False
            lease = await client.renew(lease_id, duration)
            return lease, (await client.status()).now, True

    lease, now, renewed = run_call(go)
    if not renewed:
        fail(
            FailedPrecondition(
                f"lease {lease.id} already runs to {at(lease.expires_at, now)}, past the "
                f"{human_duration(duration)} asked for; a renewal never shortens a lease",
                reason=WOULD_SHORTEN,
                metadata={"lease_id": lease.id},
            )
        )
    if o.json:
        print_json(lease.to_json())
    else:
        click.echo(lease_summary(lease, now))


def _role(st: BrokerStatus) -> str:
    if st.journal_store != "postgresql":
        return f"leader (single, {st.journal_store or 'sqlite'})"
    if st.role == "leader":
        return f"leader (epoch {st.epoch}, postgresql)"
    return f"{st.role} (the leader is {st.leader or 'not chosen yet'}, epoch {st.epoch})"


def _brokers_table(st: BrokerStatus) -> Table:
    """The brokers on the shared journal: each one's role and lag, as it last reported."""
    t = Table(box=None, pad_edge=False)
    for col in ("address", "role", "applied", "lag", "lag_s", "seen"):
        t.add_column(col, justify="left" if col in ("address", "role") else "right")
    for b in st.brokers:
        t.add_row(
            b.address,
            b.role,
            str(b.applied),
            str(b.lag_entries),
            human_duration(b.lag_s),
            human_duration(max(0.0, st.now - b.reported_at)) + " ago",
        )
    return t


@click.command("status", context_settings=CONTEXT)
@campaign_option
@connection_options
def status_command() -> None:
    """The broker at a glance (like sinfo): its version, role, clocks, journal, campaigns,
    live leases, queued requests and open streams; on a journal shared in PostgreSQL, the
    leader, its epoch and every broker's lag; with a campaign token, also that campaign's
    live leases and what they hold. A standby answers with the admin token only.

    \b
    Examples:
      bursar status --admin-token-file state/admin.token
      bursar status --token-file state/tokens.json --campaign storm --json
    """
    o = options()

    async def go() -> tuple[BrokerStatus, list[Lease] | None]:
        async with broker_client(o) as client:
            st = await client.status()
            mine = await client.list_leases() if st.caller.startswith("campaign:") else None
            return st, mine

    st, mine = run_call(go)
    held: dict[str, float] = {}
    for x in mine or []:
        for dim, units in x.size.items():
            held[dim] = held.get(dim, 0.0) + units
    if o.json:
        out: dict[str, Any] = {"status": st.to_json()}
        if mine is not None:
            out["campaign"] = {
                "name": st.caller.removeprefix("campaign:"),
                "leases": [x.to_json() for x in mine],
                "held": held,
            }
        print_json(out)
        return
    rows = [
        ("broker", f"bursar {st.version} at {o.address}"),
        ("role", _role(st)),
        ("you are", st.caller),
        ("clock", at(st.now)),
        ("last decision", at(st.engine_now, st.now)),
        ("up since", at(st.started_at, st.now)),
        ("journal", f"{st.journal_entries} entries"),
        ("campaigns", str(st.campaigns)),
        ("live leases", str(st.leases)),
        ("queued requests", str(st.pending)),
        ("open streams", str(st.open_streams)),
    ]
    if mine is not None:
        rows.append(("your leases", f"{len(mine)}, holding {_size(held)}"))
    if o.tsv:
        click.echo("\n".join(["field\tvalue", *(f"{k}\t{v}" for k, v in rows)]))
        if mine:
            click.echo()
    else:
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            click.echo(f"{k:<{width}}  {v}")
    if st.brokers:
        if o.tsv:
            click.echo()
        print_tables(_brokers_table(st))
    if mine:
        print_tables(leases_table(mine, st.now))
