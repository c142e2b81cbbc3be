"""``bursar policy ...``: show the policy in force and change it, on a running broker (the
admin token) or in a stopped broker's state directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from bursar.cli.client import CONTEXT, admin_client, connection_options, options, run_call
from bursar.providers.client import PolicyApplied, PolicyChange, PolicyState

__all__ = ["policy"]

EXIT_BAD_INPUT = 2

_STATE_HELP = (
    "A stopped broker's state directory: read or change its journal directly (refused "
    "while a broker serves it). Without it, the running broker at --target is asked "
    "(with --admin-token-file)."
)


@click.group("policy", context_settings=CONTEXT)
@connection_options
def policy() -> None:
    """Show and change the policy in force (grace period, headroom, patience, prices, ...).

    A change is journaled as an apply_policy entry: the broker decides by the new policy
    from that entry on, and a replay or audit changes policy at the same entry. Leases keep
    their terms and warnings already sent keep their deadlines; enforcement and
    fairshare_half_life_s cannot change on a live broker (see docs/concepts.md).

    \b
    Examples:
      bursar policy --admin-token-file state/admin.token show
      bursar policy --admin-token-file state/admin.token apply --config site.toml --dry-run
      bursar policy --admin-token-file state/admin.token apply --config site.toml
      bursar policy apply --state-dir state --config site.toml     # broker stopped
    """


def _value(v: Any) -> str:
    if v is None:
        return "(none)"
    return json.dumps(v) if isinstance(v, str | dict | list) else f"{v}"


def _print_changes(changes: tuple[PolicyChange, ...]) -> None:
    width = max((len(c.key) for c in changes), default=0)
    for c in changes:
        click.echo(f"  {c.key:<{width}}  {_value(c.old)} -> {_value(c.new)}")


def _report(done: PolicyApplied, dry_run: bool) -> None:
    if options().json:
        click.echo(json.dumps(done.to_json(), sort_keys=True))
        return
    if not done.changes:
        click.echo("no change: the policy given is the one in force")
        return
    click.echo(f"{len(done.changes)} setting(s) change:")
    _print_changes(done.changes)
    if dry_run:
        click.echo("dry run: valid, nothing journaled")
    else:
        click.echo(f"applied at journal entry {done.seq}")


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@policy.command("apply", context_settings=CONTEXT)
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The config file (TOML or YAML) whose [policy] is to be in force, as `bursar serve "
    "--config` would read it; its other tables are checked, not applied.",
)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help=_STATE_HELP)
@click.option("--dry-run", is_flag=True, help="Print the diff and check it; journal nothing.")
@connection_options
def policy_apply(config_path: Path, state_dir: Path | None, dry_run: bool) -> None:
    """Put the config file's policy in force: prints each setting that changes (in force
    -> new), then the journal entry the change was written as.

    Every setting of the file counts (one it leaves out takes its default), so after a
    change `bursar serve --config FILE` on the same state directory starts normally. A
    value out of range or a setting a live broker may not change is refused, naming the
    key and what is allowed; a refused change journals nothing.
    """
    from bursar.broker.codec import dumps
    from bursar.broker.config import load_policy
    from bursar.broker.errors import BursarError, RequestError
    from bursar.broker.specs import spec_to_dict

    try:
        new = load_policy(config_path)
    except BursarError as exc:
        _fail(exc)
    if state_dir is not None:
        from bursar.broker.policy_apply import apply_offline

        try:
            got = apply_offline(state_dir, new, dry_run=dry_run)
        except (BursarError, RequestError) as exc:
            _fail(exc)
        done = PolicyApplied(
            tuple(PolicyChange(k, a, b) for k, (a, b) in got.changes.items()),
            got.seq > 0,
            got.seq,
            PolicyState(spec_to_dict(got.policy), got.seq),
        )
        _report(done, dry_run)
        return
    o = options()
    spec_json = dumps(spec_to_dict(new))

    async def go() -> PolicyApplied:
        async with admin_client(o) as admin:
            return await admin.apply_policy(spec_json=spec_json, dry_run=dry_run)

    _report(run_call(go), dry_run)


@policy.command("show", context_settings=CONTEXT)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help=_STATE_HELP)
@connection_options
def policy_show(state_dir: Path | None) -> None:
    """The policy in force, one setting a line, and the journal entry of its last change."""
    if state_dir is not None:
        from bursar.broker.errors import BursarError
        from bursar.broker.journal import JOURNAL_FILENAME, Journal
        from bursar.broker.specs import spec_to_dict

        try:
            with Journal.open(state_dir / JOURNAL_FILENAME) as j:
                state = PolicyState(spec_to_dict(j.current_policy), j.policy_changed_at)
        except BursarError as exc:
            _fail(exc)
    else:
        o = options()

        async def go() -> PolicyState:
            async with admin_client(o) as admin:
                return await admin.get_policy()

        state = run_call(go)
    if options().json:
        click.echo(json.dumps(state.to_json(), sort_keys=True))
        return
    flat: list[tuple[str, Any]] = []
    for k, v in sorted(state.spec.items()):
        if isinstance(v, dict):
            flat.extend((f"{k}.{d}", x) for d, x in sorted(v.items()))
            if not v:
                flat.append((k, "(none)"))
        else:
            flat.append((k, v))
    width = max(len(k) for k, _ in flat)
    for k, v in flat:
        click.echo(f"{k:<{width}}  {v if isinstance(v, str) else _value(v)}")
    if state.changed_at:
        click.echo(f"(last changed at journal entry {state.changed_at})")
    else:
        click.echo("(the policy the journal was written with)")
