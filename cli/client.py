"""What ``bursar campaigns``, ``bursar leases`` and ``bursar supply`` share: a running broker
from a terminal, through :mod:`bursar.providers.client`.

Every group and command takes the connection options (given on the group or on the
command; the command's win): ``--target`` (``BURSAR_TARGET``), a token (``--token`` /
``BURSAR_TOKEN``, ``--token-file`` / ``BURSAR_TOKEN_FILE``), ``--admin-token-file``
(``BURSAR_ADMIN_TOKEN_FILE``), ``--tls`` / ``--tls-ca``, ``--json`` and ``--tsv``.
Output is rich tables for people (full width off a terminal), JSON with ``--json`` (JSON
lines for streams), tab-separated values with ``--tsv``. A failed call prints the
broker's message (and a hint, where it adds something) to stderr and exits 1; bad usage
exits 2.

A flag given on the command line beats every environment variable: an explicit token of
any kind sets aside the ``BURSAR_*`` tokens, and an explicit credential that names its
campaign (a token, the admin token) sets aside ``BURSAR_CAMPAIGN``, which then only picks
an entry of a token table. What the environment did decide is named on stderr before the
output (``campaign: storm (from BURSAR_CAMPAIGN)``), never in ``--json`` output.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from bursar.cli.console import human_duration, report_console, tsv_lines
from bursar.providers.client import (
    DEFAULT_TARGET,
    AlreadyExists,
    AsyncAdminClient,
    AsyncBrokerClient,
    BursarClientError,
    InvalidArgument,
    InvalidToken,
    NotFound,
    PermissionDenied,
    Refused,
    Unauthenticated,
    Unavailable,
    check_token,
    read_token_file,
)

__all__ = [
    "CONTEXT",
    "EXIT_CALL_FAILED",
    "WOULD_SHORTEN",
    "Options",
    "TokenProblem",
    "admin_client",
    "broker_client",
    "campaign_option",
    "connection_options",
    "fail",
    "options",
    "print_json",
    "print_json_line",
    "print_tables",
    "run_call",
    "stdout_console",
]

T = TypeVar("T")

EXIT_CALL_FAILED = 1
"""Exit status when the broker refused a call or could not be reached."""

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
"""The context settings of every client command: -h, and help text up to 100 columns."""

WOULD_SHORTEN = "WOULD_SHORTEN"
"""The reason of a renewal the CLI did not send because it could only have shortened the
lease (the broker never shortens one: it keeps the later end)."""

_CALL_RETRY_S = 3.0
"""How long a command retries an unreachable broker before it gives up."""


# ---------------------------------------------------------------------------------------
# Connection options


@dataclass
class Options:
    target: str | None = None
    token: str | None = None
    token_file: Path | None = None
    admin_token_file: Path | None = None
    campaign: str | None = None
    tls: bool = False
    tls_ca: Path | None = None
    retry_timeout_s: float | None = None
    json: bool = False
    tsv: bool = False
    from_env: dict[str, str] = field(default_factory=dict)
    """Option name -> the environment variable its value came from."""
    explicit: set[str] = field(default_factory=set)
    """Options given on the command line (of the group or of the command)."""
    announced: bool = False

    @property
    def address(self) -> str:
        return self.target or DEFAULT_TARGET

    def tls_arg(self) -> Path | bool:
        return self.tls_ca if self.tls_ca is not None else self.tls


def _store(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None or value is False:
            return
        o = ctx.ensure_object(Options)
        assert param.name is not None
        from_env = ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
        if from_env and name in o.explicit:
            return  # the group's flag stands against the command's environment variable
        setattr(o, name, value)
        if from_env:
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
            # The variable that was set (the first, where several are).
            o.from_env[name] = next((v for v in names if os.environ.get(v)), str(names[0]))
        else:
            o.explicit.add(name)
            o.from_env.pop(name, None)

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
                "envvar": ["BURSAR_TARGET", "BURSAR_BROKER"],
                "metavar": "HOST:PORT",
                "help": "The broker's address, or the addresses of the brokers sharing one "
                "journal, comma-separated (calls follow the leader); --broker is the same "
                f"[env BURSAR_TARGET or BURSAR_BROKER; default {DEFAULT_TARGET}].",
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
                "--campaign naming the entry (not needed when it holds one) "
                "[env BURSAR_TOKEN_FILE].",
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
        (
            "--tsv",
            "tsv",
            {
                "is_flag": True,
                "default": None,
                "help": "Print tables as tab-separated values (a header line, then one line "
                "per row), for cut, awk and spreadsheets.",
            },
        ),
    ]
    for flag, name, kw in reversed(specs):  # decorators apply bottom-up
        decls = (flag, "--broker") if flag == "--target" else (flag,)
        f = click.option(*decls, name, expose_value=False, callback=_store(name), **kw)(f)
    return f


def campaign_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--campaign",
        envvar="BURSAR_CAMPAIGN",
        callback=_store("campaign"),
        expose_value=False,
        metavar="NAME",
        help="With the admin token: only this campaign. With --token-file "
        "STATE/tokens.json: whose token to use (may be left out when it holds one) "
        "[env BURSAR_CAMPAIGN].",
    )(f)


def options() -> Options:
    o = click.get_current_context().ensure_object(Options)
    if o.json and o.tsv:
        raise click.UsageError("--json and --tsv are two ways to print the same thing: pick one")
    return o


_TOKENS = ("token", "token_file", "admin_token_file")


def _is_table(path: Path) -> bool:
    try:
        return path.read_text(encoding="utf-8").lstrip().startswith("{")
    except OSError:
        return False


def effective(o: Options) -> Options:
    """``o`` with the environment's values that an explicit flag sets aside removed: a
    token given on the command line (of any kind) sets aside the tokens from the
    environment, and one that names its own campaign (anything but a table of campaigns'
    tokens) sets aside ``BURSAR_CAMPAIGN``, which would otherwise filter the admin's view
    or contradict the token."""
    drop: dict[str, None] = {}
    if any(k in o.explicit for k in _TOKENS):
        drop.update({k: None for k in _TOKENS if k in o.from_env})
    kept = replace(o, **drop, from_env={k: v for k, v in o.from_env.items() if k not in drop})
    if "campaign" in kept.from_env and any(k in o.explicit for k in _TOKENS):
        table = kept.token is None and kept.token_file is not None and _is_table(kept.token_file)
        if not table:
            kept.campaign = None
            del kept.from_env["campaign"]
    return kept


_SHOWN = {
    "target": "target",
    "campaign": "campaign",
    "token": "token",
    "token_file": "token file",
    "admin_token_file": "admin token file",
}
"""The options whose value from the environment shapes a result, as the header names them."""


def _announce(o: Options, used: Options) -> None:
    """Name on stderr, once, what the environment decided (for people: never with
    --json or --tsv, whose readers parse stdout and may not look at stderr)."""
    if o.announced or o.json or o.tsv:
        return
    o.announced = True
    for key, var in used.from_env.items():
        label, value = _SHOWN.get(key), getattr(used, key, None)
        if label is not None and value is not None:
            text = "(set)" if key == "token" else value  # a token is a secret: not echoed
            click.echo(f"{label}: {text} (from {var})", err=True)


class TokenProblem(click.ClickException):
    """A token that cannot be used, found before anything is sent: one line, exit 2."""

    exit_code = 2


def _read_token(path: Path, campaign: str | None) -> str:
    try:
        return read_token_file(path, campaign)
    except InvalidToken as exc:
        raise TokenProblem(str(exc)) from None


def _read_admin_token(path: Path) -> str:
    if path.read_text(encoding="utf-8").lstrip().startswith("{"):
        raise TokenProblem(
            f"{path} is a table of campaigns' tokens, not the admin token: pass "
            "--admin-token-file STATE/admin.token, or this file as --token-file with --campaign"
        )
    return _read_token(path, None)


def _checked(token: str, source: str) -> str:
    try:
        return check_token(token.strip(), source)
    except InvalidToken as exc:
        raise TokenProblem(str(exc)) from None


def _campaign_token(o: Options) -> str:
    if o.token:
        return _checked(o.token, "--token (BURSAR_TOKEN)")
    if o.token_file:
        return _read_token(o.token_file, o.campaign)
    if o.admin_token_file:
        return _read_admin_token(o.admin_token_file)
    raise click.UsageError(
        "no token: pass --token or --token-file (or set BURSAR_TOKEN), or "
        "--admin-token-file for the admin's view of every campaign"
    )


def _admin_token(o: Options) -> str:
    if o.admin_token_file:
        return _read_admin_token(o.admin_token_file)
    if o.token:
        return _checked(o.token, "--token (BURSAR_TOKEN)")
    if o.token_file:
        return _read_token(o.token_file, o.campaign)
    raise click.UsageError(
        "campaign commands need the admin token: pass --admin-token-file STATE/admin.token "
        "(or set BURSAR_ADMIN_TOKEN_FILE)"
    )


def _retry_s(o: Options) -> float:
    return _CALL_RETRY_S if o.retry_timeout_s is None else o.retry_timeout_s


def broker_client(o: Options, *, forever: bool = False) -> AsyncBrokerClient:
    used = effective(o)
    token = _campaign_token(used)
    _announce(o, used)
    o = used
    # --campaign is always sent: the admin token then acts for that campaign only, and a
    # campaign token given with another campaign's name is refused by the broker with a
    # message naming both, rather than silently acting for its own campaign.
    return AsyncBrokerClient(
        o.address,
        token,
        tls=o.tls_arg(),
        campaign=o.campaign,
        retry_timeout_s=None if forever else _retry_s(o),
    )


def admin_client(o: Options) -> AsyncAdminClient:
    used = effective(o)
    token = _admin_token(used)
    _announce(o, used)
    return AsyncAdminClient(used.address, token, tls=used.tls_arg(), retry_timeout_s=_retry_s(used))


# ---------------------------------------------------------------------------------------
# Running calls, reporting errors, printing


def _hint(exc: BursarClientError, o: Options) -> str:
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
            return f"the broker suggests retrying in {human_duration(exc.retry_after)}"
        return "retrying as is will not help"
    if exc.reason == WOULD_SHORTEN:
        return f"to end it sooner, release it when done: bursar release {exc.metadata['lease_id']}"
    if isinstance(exc, InvalidArgument) and exc.field_violations:
        return "; ".join(f"{v.field}: {v.description}" for v in exc.field_violations)
    return ""


def _fail(exc: BursarClientError, o: Options) -> NoReturn:
    hint = _hint(exc, o)
    if hint in exc.message:  # a hint that only says the error again is left out
        hint = ""
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
        # soft_wrap: a message is one line however narrow the terminal (or 80 columns
        # off one); the terminal wraps it, and a log or grep sees it whole.
        console = Console(stderr=True, highlight=False, soft_wrap=True)
        reason = f" [dim]({exc.reason})[/dim]" if exc.reason else ""
        console.print(f"[red]error[/red]: {_escape(exc.message)}{reason}")
        if hint:
            console.print(f"[yellow]hint[/yellow]: {_escape(hint)}")
    sys.exit(EXIT_CALL_FAILED)


def _escape(text: str) -> str:
    return text.replace("[", r"\[")


def fail(exc: BursarClientError) -> NoReturn:
    """End the command as a failed call does: the message (and a hint), exit status 1."""
    _fail(exc, options())


def run_call(make: Callable[[], Awaitable[T]]) -> T:
    """Run one command's coroutine; a failed call becomes a message and exit status 1."""
    o = options()
    try:
        return asyncio.run(make())  # type: ignore[arg-type]
    except BursarClientError as exc:
        _fail(exc, o)
    except InvalidToken as exc:
        raise TokenProblem(str(exc)) from None
    except KeyboardInterrupt:
        sys.exit(130)


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False))


def print_json_line(obj: Any) -> None:
    click.echo(json.dumps(obj, sort_keys=True, allow_nan=False))
    sys.stdout.flush()


def stdout_console() -> Console:
    """The console the commands print to stdout with: full width off a terminal (a pipe,
    a file), where rich would otherwise cut cells at 80 columns (``expir…``)."""
    return report_console(highlight=False)


def print_tables(*items: object) -> None:
    """Print ``items`` (tables and lines of text) for people, or, with --tsv, the tables
    alone as tab-separated values, a blank line between two tables."""
    if not options().tsv:
        console = stdout_console()
        for item in items:
            # Off a terminal, as wide as the item needs: no cell cut short, however wide.
            wide = console.measure(item).maximum if not console.is_terminal else 0  # type: ignore[arg-type]
            console.print(item, width=max(console.width, wide))
        return
    blocks = ["\n".join(tsv_lines(t)) for t in items if isinstance(t, Table)]
    click.echo("\n\n".join(blocks))
