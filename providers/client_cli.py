"""``bursar campaigns``, ``bursar leases`` and ``bursar supply``: a running broker from a
terminal, through :mod:`bursar.providers.client`.

Every group and command takes the connection options (given on the group or on the
command; the command's win): ``--target`` (``BURSAR_TARGET``), a token (``--token`` /
``BURSAR_TOKEN``, ``--token-file`` / ``BURSAR_TOKEN_FILE``), ``--admin-token-file``
(``BURSAR_ADMIN_TOKEN_FILE``), ``--tls`` / ``--tls-ca`` and ``--json``. Output is rich
tables for people, JSON with ``--json`` (JSON lines for streams). A failed call prints
the broker's message and a hint to stderr and exits 1; bad usage exits 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich import box
from rich.console import Console
from rich.table import Table

from bursar.providers.client import (
    DEFAULT_TARGET,
    AlreadyExists,
    AsyncAdminClient,
    AsyncBrokerClient,
    BursarClientError,
    Campaign,
    CampaignSpec,
    DimEnvelope,
    FailedPrecondition,
    InvalidArgument,
    Lease,
    LeaseClass,
    LeaseEvent,
    NotFound,
    PermissionDenied,
    Refused,
    Supply,
    Unauthenticated,
    Unavailable,
)

__all__ = ["EXIT_CALL_FAILED", "campaigns", "leases", "supply"]

T = TypeVar("T")

EXIT_CALL_FAILED = 1
"""Exit status when the broker refused a call or could not be reached."""

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_CALL_RETRY_S = 3.0
"""How long a command retries an unreachable broker before it gives up."""


# ---------------------------------------------------------------------------------------
# Connection options


@dataclass
class _Options:
    target: str | None = None
    token: str | None = None
    token_file: Path | None = None
    admin_token_file: Path | None = None
    campaign: str | None = None
    tls: bool = False
    tls_ca: Path | None = None
    retry_timeout_s: float | None = None
    json: bool = False

    @property
    def address(self) -> str:
        return self.target or DEFAULT_TARGET

    def tls_arg(self) -> Path | bool:
        return self.tls_ca if self.tls_ca is not None else self.tls


def _store(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value is not None and value is not False:
            setattr(ctx.ensure_object(_Options), name, value)

    return callback


def connection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every group and command accepts (stored on the context object, so
    that a command's value overrides its group's)."""
    file = click.Path(dir_okay=False, exists=True, path_type=Path)
    specs: list[tuple[str, str, dict[str, Any]]] = [
        (
            "--target",
            "target",
            {
                "envvar": "BURSAR_TARGET",
                "metavar": "HOST:PORT",
                "help": f"The broker's address [env BURSAR_TARGET; default {DEFAULT_TARGET}].",
            },
        ),
        (
            "--token",
            "token",
            {
                "envvar": "BURSAR_TOKEN",
                "help": "A campaign token, or the admin token [env BURSAR_TOKEN].",
            },
        ),
        (
            "--token-file",
            "token_file",
            {
                "envvar": "BURSAR_TOKEN_FILE",
                "type": file,
                "help": "A file holding the token; or the broker's STATE/tokens.json, with "
                "--campaign naming the entry [env BURSAR_TOKEN_FILE].",
            },
        ),
        (
            "--admin-token-file",
            "admin_token_file",
            {
                "envvar": "BURSAR_ADMIN_TOKEN_FILE",
                "type": file,
                "help": "A file holding the admin token, e.g. STATE/admin.token "
                "[env BURSAR_ADMIN_TOKEN_FILE].",
            },
        ),
        (
            "--tls",
            "tls",
            {
                "is_flag": True,
                "default": None,
                "help": "Connect with TLS, trusting the system's root certificates.",
            },
        ),
        (
            "--tls-ca",
            "tls_ca",
            {
                "type": file,
                "help": "Connect with TLS, trusting the root certificates in this PEM file.",
            },
        ),
        (
            "--retry-timeout",
            "retry_timeout_s",
            {
                "envvar": "BURSAR_RETRY_TIMEOUT",
                "type": click.FloatRange(min=0),
                "metavar": "SECONDS",
                "help": "How long to retry an unreachable broker before giving up "
                f"[env BURSAR_RETRY_TIMEOUT; default {_CALL_RETRY_S:g}]. Watches reconnect "
                "for as long as they run.",
            },
        ),
        (
            "--json",
            "json",
            {"is_flag": True, "default": None, "help": "Print JSON instead of tables."},
        ),
    ]
    for flag, name, kw in reversed(specs):  # decorators apply bottom-up
        f = click.option(flag, name, expose_value=False, callback=_store(name), **kw)(f)
    return f


def _opts() -> _Options:
    return click.get_current_context().ensure_object(_Options)


def _read_token(path: Path, campaign: str | None) -> str:
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith("{"):
        try:
            table = json.loads(text)
        except ValueError as exc:
            raise click.UsageError(f"{path}: not a token nor a JSON token table: {exc}") from None
        if not campaign:
            names = ", ".join(sorted(table)) or "none"
            raise click.UsageError(
                f"{path} holds several campaigns' tokens ({names}): name one with --campaign"
            )
        if campaign not in table:
            raise click.UsageError(f"{path} has no token for campaign {campaign!r}")
        return str(table[campaign])
    if not text:
        raise click.UsageError(f"{path} is empty")
    return text


def _campaign_token(o: _Options) -> str:
    if o.token:
        return o.token
    if o.token_file:
        return _read_token(o.token_file, o.campaign)
    if o.admin_token_file:
        return _read_token(o.admin_token_file, None)
    raise click.UsageError(
        "no token: pass --token or --token-file (or set BURSAR_TOKEN), or "
        "--admin-token-file for the admin's view of every campaign"
    )


def _admin_token(o: _Options) -> str:
    if o.admin_token_file:
        return _read_token(o.admin_token_file, None)
    if o.token:
        return o.token
    if o.token_file:
        return _read_token(o.token_file, None)
    raise click.UsageError(
        "campaign commands need the admin token: pass --admin-token-file STATE/admin.token "
        "(or set BURSAR_ADMIN_TOKEN_FILE)"
    )


def _retry_s(o: _Options) -> float:
    return _CALL_RETRY_S if o.retry_timeout_s is None else o.retry_timeout_s


def _broker(o: _Options, *, forever: bool = False) -> AsyncBrokerClient:
    token = _campaign_token(o)
    # The admin token acts for every campaign; a campaign token ignores --campaign here
    # (the server would refuse a different name).
    admin = o.token_file is None and o.token is None
    return AsyncBrokerClient(
        o.address,
        token,
        tls=o.tls_arg(),
        campaign=o.campaign if admin else None,
        retry_timeout_s=None if forever else _retry_s(o),
    )


def _admin(o: _Options) -> AsyncAdminClient:
    return AsyncAdminClient(
        o.address, _admin_token(o), tls=o.tls_arg(), retry_timeout_s=_retry_s(o)
    )


# ---------------------------------------------------------------------------------------
# Running calls, reporting errors


def _hint(exc: BursarClientError, o: _Options) -> str:
    if isinstance(exc, Unavailable):
        return (
            f"is the broker running at {o.address}? Start one with `bursar serve`, or point "
            "--target (BURSAR_TARGET) at it"
        )
    if isinstance(exc, Unauthenticated):
        return (
            "pass a valid token: --token, --token-file or BURSAR_TOKEN (the broker wrote "
            "campaign tokens to STATE/tokens.json and the admin token to STATE/admin.token)"
        )
    if isinstance(exc, PermissionDenied):
        if exc.reason == "ADMIN_ONLY":
            return "this needs the admin token: --admin-token-file STATE/admin.token"
        return "a campaign token acts for its own campaign only; the admin token acts for any"
    if isinstance(exc, AlreadyExists):
        return "change an existing campaign with `bursar campaigns update`"
    if isinstance(exc, NotFound):
        return "list what exists with `bursar leases list` or `bursar campaigns list`"
    if isinstance(exc, Refused):
        if math.isfinite(exc.retry_after):
            return f"the broker suggests retrying in {exc.retry_after:.1f} s"
        return "retrying as is will not help"
    if isinstance(exc, InvalidArgument) and exc.field_violations:
        return "; ".join(f"{v.field}: {v.description}" for v in exc.field_violations)
    if isinstance(exc, FailedPrecondition):
        return "the request does not fit the broker's current state"
    return ""


def _fail(exc: BursarClientError, o: _Options) -> NoReturn:
    hint = _hint(exc, o)
    if o.json:
        err = {
            "error": {
                "code": exc.code.name,
                "reason": exc.reason,
                "message": exc.message,
                "retry_after": exc.retry_after
                if exc.retry_after is not None and math.isfinite(exc.retry_after)
                else None,
                "hint": hint,
            }
        }
        click.echo(json.dumps(err, sort_keys=True), err=True)
    else:
        console = Console(stderr=True, highlight=False)
        reason = f" [dim]({exc.reason})[/dim]" if exc.reason else ""
        console.print(f"[red]error[/red]: {_escape(exc.message)}{reason}")
        if hint:
            console.print(f"[yellow]hint[/yellow]: {_escape(hint)}")
    sys.exit(EXIT_CALL_FAILED)


def _escape(text: str) -> str:
    return text.replace("[", r"\[")


def _run(make: Callable[[], Awaitable[T]]) -> T:
    """Run one command's coroutine; a failed call becomes a message and exit status 1."""
    o = _opts()
    try:
        return asyncio.run(make())  # type: ignore[arg-type]
    except BursarClientError as exc:
        _fail(exc, o)
    except KeyboardInterrupt:
        sys.exit(130)


def _print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False))


def _print_json_line(obj: Any) -> None:
    click.echo(json.dumps(obj, sort_keys=True, allow_nan=False))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------
# Formatting


def _num(x: float | None) -> str:
    """Compact: 8, 0.25, 1536, 100k, 3.84M; ∞ for unlimited (None or +inf)."""
    if x is None or math.isinf(x):
        return "∞" if x is None or x > 0 else "-∞"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g}k"
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.4g}"


def _size(size: Mapping[str, float]) -> str:
    return " ".join(f"{_num(v)} {d}" for d, v in size.items()) or "-"


def _when(t: float | None, now: float) -> str:
    """``in 42s`` / ``3s ago`` relative to ``now``."""
    if t is None or t == 0:
        return "-"
    d = t - now
    text = _duration(abs(d))
    return "now" if text == "0s" else f"in {text}" if d > 0 else f"{text} ago"


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s".replace(".0s", "s")
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def _table(title: str | None = None) -> Table:
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
    )


def _console() -> Console:
    return Console(highlight=False)


# ---------------------------------------------------------------------------------------
# bursar campaigns


@click.group("campaigns", context_settings=_CONTEXT)
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


def _campaigns_tables(items: list[Campaign]) -> list[Table]:
    """Two tables: what each campaign was given (its envelope per dimension) and where it
    stands now (held, bucket level, leases, credits)."""
    env = _table("Envelopes")
    env.add_column("campaign", no_wrap=True)
    env.add_column("class")
    env.add_column("dim", no_wrap=True)
    for col in ("guarantee", "sustained", "burst", "bucket"):
        env.add_column(col, justify="right")
    now = _table("Now")
    now.add_column("campaign", no_wrap=True)
    now.add_column("dim", no_wrap=True)
    for col in ("held", "bucket level", "leases", "queued", "credits"):
        now.add_column(col, justify="right")
    for c in items:
        dims = list(c.spec.envelopes) or ["-"]
        flags = [c.spec.lease_class.value.lower()]
        if c.spec.preemptible:
            flags.append("preemptible")
        n = max(len(dims), len(flags))
        for k in range(n):
            d = dims[k] if k < len(dims) else ""
            e = c.spec.envelopes.get(d)
            env.add_row(
                c.name if k == 0 else "",
                flags[k] if k < len(flags) else "",
                d,
                *(
                    (_num(e.guarantee), _num(e.sustained), _num(e.burst), _num(e.bucket))
                    if e
                    else ("",) * 4
                ),
                end_section=k == n - 1,
            )
        for k, d in enumerate(dims):
            now.add_row(
                c.name if k == 0 else "",
                d,
                _num(c.held.get(d, 0.0)) if d in c.spec.envelopes else "",
                _num(c.bucket[d]) if d in c.bucket else "",
                str(c.leases) if k == 0 else "",
                str(c.queued) if k == 0 else "",
                f"{c.credits:.2f}" if k == 0 else "",
                end_section=k == len(dims) - 1,
            )
    if not items:
        env.caption = "no campaigns yet: bursar campaigns create NAME --envelope gpu:..."
        return [env]
    env.caption = "bucket: unit-seconds; ∞: unlimited"
    return [env, now]


def _print_campaigns(items: list[Campaign]) -> None:
    console = _console()
    for t in _campaigns_tables(items):
        console.print(t)


@campaigns.command("list", context_settings=_CONTEXT)
@connection_options
def campaigns_list() -> None:
    """Every campaign: its envelope per dimension and where it stands now."""
    o = _opts()

    async def go() -> list[Campaign]:
        async with _admin(o) as admin:
            return await admin.list_campaigns()

    items = _run(go)
    if o.json:
        _print_json([c.to_json() for c in items])
    else:
        _print_campaigns(items)


@campaigns.command("show", context_settings=_CONTEXT)
@click.argument("name")
@connection_options
def campaigns_show(name: str) -> None:
    """One campaign: its envelope and where it stands now."""
    o = _opts()

    async def go() -> Campaign:
        async with _admin(o) as admin:
            return await admin.get_campaign(name)

    c = _run(go)
    if o.json:
        _print_json(c.to_json())
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
    _console().print(f"[green]{verb}[/green] campaign {c.name}")


@campaigns.command("create", context_settings=_CONTEXT)
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
    o = _opts()
    parsed = dict(_parse_envelope(e) for e in envelopes)
    spec = CampaignSpec(
        name,
        {d: _envelope(DimEnvelope(), v) for d, v in parsed.items()},
        LeaseClass.parse(lease_class),
        preemptible,
    )

    async def go() -> Any:
        async with _admin(o) as admin:
            return await admin.create_campaign(spec)

    created = _run(go)
    if save_token is not None:
        fd = os.open(save_token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(created.token + "\n")
    if o.json:
        out: dict[str, Any] = {"campaign": created.campaign.to_json()}
        out["token"] = None if save_token is not None else created.token
        if save_token is not None:
            out["token_file"] = str(save_token)
        _print_json(out)
        return
    _show_campaign(created.campaign, "created")
    if save_token is not None:
        click.echo(f"token written to {save_token} (mode 0600)")
    else:
        click.echo(f"token: {created.token}")
        click.echo("(shown only once; `bursar` reads it from --token or BURSAR_TOKEN)")


@campaigns.command("update", context_settings=_CONTEXT)
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
@connection_options
def campaigns_update(
    name: str,
    envelopes: tuple[str, ...],
    remove: tuple[str, ...],
    lease_class: str | None,
    preemptible: bool | None,
) -> None:
    """Change campaign NAME: only what you pass changes; its leases stay."""
    o = _opts()
    parsed = dict(_parse_envelope(e) for e in envelopes)

    async def go() -> Campaign:
        async with _admin(o) as admin:
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
            return await admin.update_campaign(spec)

    c = _run(go)
    if o.json:
        _print_json(c.to_json())
    else:
        _show_campaign(c, "updated")


# ---------------------------------------------------------------------------------------
# bursar leases


def campaign_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--campaign",
        callback=_store("campaign"),
        expose_value=False,
        metavar="NAME",
        help="With the admin token: only this campaign. With --token-file "
        "STATE/tokens.json: whose token to use.",
    )(f)


@click.group("leases", context_settings=_CONTEXT)
@campaign_option
@connection_options
def leases() -> None:
    """List and watch leases (a campaign's own, or every campaign's with the admin token).

    \b
    Examples:
      bursar leases --token-file state/tokens.json --campaign sci list
      bursar leases --admin-token-file state/admin.token watch --json
    """


def _leases_table(items: list[Lease], now: float) -> Table:
    t = _table()
    for col in ("lease", "campaign", "state", "size", "path", "class", "nodes"):
        t.add_column(col, no_wrap=col in ("lease", "campaign", "state"))
    t.add_column("starts", justify="right")
    t.add_column("expires", justify="right")
    t.add_column("labels")
    for x in items:
        state = x.state.value.lower()
        if x.preempt_deadline is not None:
            state += f" (revoked {_when(x.preempt_deadline, now)})"
        t.add_row(
            x.id,
            x.campaign,
            state,
            _size(x.size),
            x.path.value.lower(),
            x.lease_class.value.lower() + (" preemptible" if x.preemptible else ""),
            ",".join(x.nodes) or "-",
            _when(x.starts_at, now),
            _when(x.expires_at, now),
            ",".join(f"{k}={v}" for k, v in x.labels.items()) or "-",
        )
    if not items:
        t.caption = "no live leases"
    return t


@leases.command("list", context_settings=_CONTEXT)
@campaign_option
@connection_options
def leases_list() -> None:
    """Live leases (starting, active, preempting), oldest first."""
    o = _opts()

    async def go() -> tuple[list[Lease], float]:
        async with _broker(o) as client:
            status = await client.status()
            return await client.list_leases(), status.now

    items, now = _run(go)
    if o.json:
        _print_json([x.to_json() for x in items])
    else:
        _console().print(_leases_table(items, now))


def _event_line(ev: LeaseEvent) -> str:
    x = ev.lease
    parts = [
        _clock(ev.at),
        f"{ev.kind.value.lower():<15}",
        f"{x.id:<6}",
        x.campaign,
        x.state.value.lower(),
    ]
    if x.size:
        parts.append(_size(x.size))
    if x.nodes:
        parts.append("on " + ",".join(x.nodes))
    if ev.deadline is not None:
        parts.append(f"revoked at {_clock(ev.deadline)}")
    if ev.for_request:
        parts.append(f"for {ev.for_request}")
    if ev.cause:
        parts.append(f"({ev.cause})")
    if x.expires_at and not x.ended:
        parts.append(f"expires {_clock(x.expires_at)}")
    if ev.snapshot:
        parts.append("[snapshot]")
    return "  ".join(parts)


@leases.command("watch", context_settings=_CONTEXT)
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
    o = _opts()

    async def go() -> None:
        async with _broker(o) as check:
            await check.status()  # fail fast on a wrong target or token
        async with _broker(o, forever=True) as client:
            stream = client.watch(list(lease_ids) or None, reconnect=not no_reconnect)
            seen = 0
            try:
                async for ev in stream:
                    if o.json:
                        _print_json_line(ev.to_json())
                    else:
                        click.echo(_event_line(ev))
                        sys.stdout.flush()
                    seen += 1
                    if count is not None and seen >= count:
                        break
            finally:
                await stream.aclose()  # type: ignore[attr-defined]

    _run(go)


@leases.command("revoke", context_settings=_CONTEXT)
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
    o = _opts()

    async def go() -> tuple[Lease, float]:
        async with _admin(o) as admin:
            ended = await admin.revoke_lease(lease_id, reason)
        return ended, ended.ended_at or 0.0

    ended, now = _run(go)
    if o.json:
        _print_json(ended.to_json())
    else:
        _console().print(_leases_table([ended], now))


# ---------------------------------------------------------------------------------------
# bursar supply


def _supply_tables(s: Supply) -> list[Table | str]:
    head = (
        f"price [bold]{s.price:,.4g}[/bold] credits/unit-h   pressure {s.pressure:.2f}   "
        f"grace {_num(s.grace_s)} s   boot {_num(s.boot_latency_s)} s"
    )
    dims = _table("Pool")
    for col in ("dim", "capacity", "warm free", "reserve", "available warm", "reclaimable"):
        dims.add_column(col, justify="left" if col == "dim" else "right")
    dims.add_column("cold", justify="right")
    for d, x in s.dims.items():
        dims.add_row(
            d,
            _num(x.capacity),
            _num(x.warm_free),
            _num(x.reserve),
            _num(x.available_warm),
            _num(x.reclaimable),
            _num(x.cold),
        )
    out: list[Table | str] = [head, dims]
    if s.campaigns:
        camps = _table("Campaigns")
        for col in ("campaign", "dim", "held", "bucket", "drains in", "to burst", "unmet"):
            camps.add_column(col, justify="left" if col in ("campaign", "dim") else "right")
        camps.add_column("queued", justify="right")
        camps.add_column("credits", justify="right")
        for name, c in s.campaigns.items():
            names = list(dict.fromkeys([*c.held, *c.bucket, *c.headroom_to_burst])) or ["-"]
            for k, d in enumerate(names):
                tte = c.time_to_empty_s.get(d)
                camps.add_row(
                    name if k == 0 else "",
                    d,
                    _num(c.held.get(d, 0.0)) if d in c.held or d in c.headroom_to_burst else "",
                    _num(c.bucket[d]) if d in c.bucket else "",
                    _duration(tte) if tte is not None else "-",
                    _num(c.headroom_to_burst[d]) if d in c.headroom_to_burst else "",
                    _num(c.unmet_guarantee[d]) if d in c.unmet_guarantee else "",
                    str(c.queued) if k == 0 else "",
                    f"{c.credits:.2f}" if k == 0 else "",
                    end_section=k == len(names) - 1,
                )
        out.append(camps)
    if s.time_to is not None:
        tt = s.time_to

        def path(v: float | None) -> str:
            return "not now" if v is None else f"{_num(v)} s"

        out.append(
            f"time to {_num(tt.units)} {tt.dim}: warm {path(tt.warm_s)}, reclaim "
            f"{path(tt.reclaim_s)}, cold {path(tt.cold_s)}"
        )
    return out


@click.command("supply", context_settings=_CONTEXT)
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
      bursar supply --token-file state/tokens.json --campaign sci --units 64
      bursar supply --admin-token-file state/admin.token --watch --json
    """
    o = _opts()

    def show(s: Supply) -> None:
        if o.json:
            (_print_json_line if watch else _print_json)(s.to_json())
            return
        console = _console()
        if watch:
            console.rule(_clock(s.at))
        for item in _supply_tables(s):
            console.print(item)

    async def go() -> None:
        if not watch:
            async with _broker(o) as client:
                show(await client.supply(units, dim))
            return
        async with _broker(o) as check:
            await check.status()
        async with _broker(o, forever=True) as client:
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

    _run(go)
