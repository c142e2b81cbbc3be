"""``bursar campaigns ...``: list, show, create and update campaigns (needs the admin
token)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from bursar.cli.client import (
    CONTEXT,
    admin_client,
    campaign_option,
    connection_options,
    options,
    print_json,
    print_tables,
    run_call,
    stdout_console,
)
from bursar.providers.client import Campaign, CampaignSpec, DimEnvelope, LeaseClass, WhatIfResult
from bursar.providers.client_view import campaigns_tables, whatif_tables

__all__ = ["campaigns"]


@click.group("campaigns", context_settings=CONTEXT)
@campaign_option
@connection_options
def campaigns() -> None:
    """List, show, create and update campaigns (needs the admin token).

    \b
    Examples:
      bursar campaigns --admin-token-file state/admin.token list
      bursar campaigns create agents --class interactive \\
          --envelope gpu:guarantee=8,sustained=16,burst=64,bucket=100000
      bursar campaigns update agents --envelope gpu:burst=128
    """


def _print_campaigns(items: list[Campaign]) -> None:
    print_tables(*campaigns_tables(items))


@campaigns.command("list", context_settings=CONTEXT)
@campaign_option
@connection_options
def campaigns_list() -> None:
    """Every campaign: its envelope per dimension and where it stands now."""
    o = options()

    async def go() -> list[Campaign]:
        async with admin_client(o) as admin:
            return await admin.list_campaigns()

    items = run_call(go)
    if o.json:
        print_json([c.to_json() for c in items])
    else:
        _print_campaigns(items)


@campaigns.command("show", context_settings=CONTEXT)
@click.argument("name")
@campaign_option
@connection_options
def campaigns_show(name: str) -> None:
    """One campaign: its envelope and where it stands now."""
    o = options()

    async def go() -> Campaign:
        async with admin_client(o) as admin:
            return await admin.get_campaign(name)

    c = run_call(go)
    if o.json:
        print_json(c.to_json())
    else:
        _print_campaigns([c])


_ENVELOPE_KEYS = ("guarantee", "sustained", "burst", "bucket")


_ENVELOPE_HELP = (
    "DIM:KEY=VALUE,... with keys guarantee, sustained, burst (units; sustained in "
    "units/s for rate dimensions) and bucket (unit-seconds, or 'unlimited'). Dimensions: "
    "gpu, cpu, mem_gb, fs_bw, inference. Repeat for several dimensions."
)


def _parse_envelope(text: str) -> tuple[str, dict[str, float | None]]:
    dim, sep, rest = text.partition(":")
    if not sep or not dim or not rest:
        raise click.BadParameter(
            f"{text!r}: expected DIM:KEY=VALUE,..., e.g. gpu:guarantee=8,burst=32",
            param_hint="--envelope",
        )
    values: dict[str, float | None] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _ENVELOPE_KEYS:
            raise click.BadParameter(
                f"{item!r}: keys are {', '.join(_ENVELOPE_KEYS)} (KEY=VALUE)",
                param_hint="--envelope",
            )
        value = value.strip()
        if key == "bucket" and value.lower() in ("unlimited", "inf", "none"):
            values[key] = None
            continue
        try:
            values[key] = float(value)
        except ValueError:
            raise click.BadParameter(
                f"{key}={value!r} is not a number", param_hint="--envelope"
            ) from None
    return dim.strip(), values


def _envelope(base: DimEnvelope, values: Mapping[str, float | None]) -> DimEnvelope:
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]


_CLASS_CHOICE = click.Choice(["interactive", "batch", "opportunistic"], case_sensitive=False)


def _show_campaign(c: Campaign, verb: str) -> None:
    _print_campaigns([c])
    stdout_console().print(f"[green]{verb}[/green] campaign {c.name}")


@campaigns.command("create", context_settings=CONTEXT)
@click.argument("name")
@click.option(
    "--envelope", "envelopes", multiple=True, metavar="DIM:KEY=VALUE,...", help=_ENVELOPE_HELP
)
@click.option(
    "--class",
    "lease_class",
    type=_CLASS_CHOICE,
    default="batch",
    show_default=True,
    help="Admission class: a higher class is considered first.",
)
@click.option(
    "--preemptible",
    is_flag=True,
    help="The facility's backfill tier: its leases may be reclaimed; guarantees must be 0.",
)
@click.option(
    "--save-token",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the new token to this file (mode 0600) instead of printing it.",
)
@campaign_option
@connection_options
def campaigns_create(
    name: str,
    envelopes: tuple[str, ...],
    lease_class: str,
    preemptible: bool,
    save_token: Path | None,
) -> None:
    """Create campaign NAME and issue its token (shown once: keep it).

    A dimension without --envelope may not be used by the campaign; a key left out of an
    envelope is 0 (bucket: unlimited).
    """
    o = options()
    parsed = dict(_parse_envelope(e) for e in envelopes)
    spec = CampaignSpec(
        name,
        {d: _envelope(DimEnvelope(), v) for d, v in parsed.items()},
        LeaseClass.parse(lease_class),
        preemptible,
    )

    async def go() -> Any:
        async with admin_client(o) as admin:
            return await admin.create_campaign(spec)

    created = run_call(go)
    if save_token is not None:
        fd = os.open(save_token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(created.token + "\n")
    if o.json:
        out: dict[str, Any] = {"campaign": created.campaign.to_json()}
        out["token"] = None if save_token is not None else created.token
        if save_token is not None:
            out["token_file"] = str(save_token)
        print_json(out)
        return
    _show_campaign(created.campaign, "created")
    if save_token is not None:
        click.echo(f"token written to {save_token} (mode 0600)")
    else:
        click.echo(f"token: {created.token}")
        click.echo("(shown only once; `bursar` reads it from --token or BURSAR_TOKEN)")


@campaigns.command("update", context_settings=CONTEXT)
@click.argument("name")
@click.option(
    "--envelope",
    "envelopes",
    multiple=True,
    metavar="DIM:KEY=VALUE,...",
    help="Change these keys of a dimension's envelope (a new dimension starts from 0 and "
    "an unlimited bucket). " + _ENVELOPE_HELP,
)
@click.option("--remove-dim", "remove", multiple=True, metavar="DIM", help="Drop a dimension.")
@click.option("--class", "lease_class", type=_CLASS_CHOICE, help="A new admission class.")
@click.option("--preemptible/--not-preemptible", default=None, help="Change the flag.")
@click.option(
    "--what-if",
    "what_if",
    is_flag=True,
    help="Show what the change would do now (queued requests granted, leases warned and "
    "reclaimed) instead of doing it: nothing is changed or journaled.",
)
@campaign_option
@connection_options
def campaigns_update(
    name: str,
    envelopes: tuple[str, ...],
    remove: tuple[str, ...],
    lease_class: str | None,
    preemptible: bool | None,
    what_if: bool,
) -> None:
    """Change campaign NAME: only what you pass changes; its leases stay.

    With --what-if the broker decides the change on a copy of its state and prints what
    it would cause, every decision (grants of queued requests the new envelope lets in,
    preemption warnings, nodes powered on), and leaves the campaign as it is.

    \b
    Example:
      bursar campaigns update adaptive-sci --envelope gpu:burst=64 --what-if
    """
    o = options()
    parsed = dict(_parse_envelope(e) for e in envelopes)

    async def go() -> Campaign | WhatIfResult:
        async with admin_client(o) as admin:
            current = (await admin.get_campaign(name)).spec
            dims = dict(current.envelopes)
            for d in remove:
                if d not in dims:
                    raise click.BadParameter(
                        f"campaign {name} has no {d!r} envelope", param_hint="--remove-dim"
                    )
                del dims[d]
            for d, values in parsed.items():
                dims[d] = _envelope(dims.get(d, DimEnvelope()), values)
            spec = CampaignSpec(
                name,
                dims,
                LeaseClass.parse(lease_class) if lease_class else current.lease_class,
                current.preemptible if preemptible is None else preemptible,
            )
            if what_if:
                return await admin.whatif_envelope(spec)
            return await admin.update_campaign(spec)

    c = run_call(go)
    if isinstance(c, WhatIfResult):
        if o.json:
            print_json(c.to_json())
            return
        print_tables(*whatif_tables(c))
        return
    if o.json:
        print_json(c.to_json())
    else:
        _show_campaign(c, "updated")
