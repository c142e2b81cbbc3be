"""``bursar dashboard``: a fresh one-time login link to a running broker's dashboard.

The broker mints the code (``POST /api/login`` on the dashboard port, with the admin token):
codes live only in the broker's memory, so nothing that signs in is ever written to disk
(see ``bursar.broker.dashboard.login`` for why this design and not a secret in the state
directory).
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

import click

from bursar.broker.service.auth import ADMIN_TOKEN_FILE
from bursar.cli.client import CONTEXT
from bursar.providers.client import InvalidToken, read_token_file

__all__ = ["DEFAULT_URL", "dashboard_command"]

DEFAULT_URL = "http://127.0.0.1:9465/"
"""Where ``bursar serve`` serves its dashboard by default (--dashboard-port 9465)."""

EXIT_FAILED = 1


@click.command("dashboard", context_settings=CONTEXT)
@click.option(
    "--url",
    envvar="BURSAR_DASHBOARD_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="The dashboard, as `bursar serve` printed it (the part before '?') "
    "[env BURSAR_DASHBOARD_URL].",
)
@click.option(
    "--state-dir",
    default=Path("state"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The broker's state directory: its admin token is read from STATE/admin.token.",
)
@click.option(
    "--admin-token-file",
    envvar="BURSAR_ADMIN_TOKEN_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The admin token's file, if not STATE/admin.token [env BURSAR_ADMIN_TOKEN_FILE].",
)
@click.option(
    "--tls-ca",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="For an https dashboard: trust the root certificates in this PEM file.",
)
def dashboard_command(
    url: str, state_dir: Path, admin_token_file: Path | None, tls_ca: Path | None
) -> None:
    """Print a fresh one-time login link to a running broker's dashboard.

    Opening the link in a browser signs in as the admin (a session cookie, HttpOnly and
    SameSite=Strict) and the link stops working. The broker makes the code, asked with the
    admin token; it keeps codes and sessions in memory only, so a restart ends them.
    """
    token_file = admin_token_file or state_dir / ADMIN_TOKEN_FILE
    try:
        token = read_token_file(token_file)
    except InvalidToken as exc:
        click.echo(f"error: {exc} (pass --state-dir or --admin-token-file)", err=True)
        sys.exit(EXIT_FAILED)
    base = url.split("?", 1)[0].rstrip("/") + "/"
    request = urllib.request.Request(
        base + "api/login",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca is not None else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            link = json.loads(resp.read())["url"]
    except urllib.error.HTTPError as exc:
        why = _error_text(exc)
        click.echo(f"error: the dashboard at {base} refused: {why}", err=True)
        sys.exit(EXIT_FAILED)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        click.echo(
            f"error: no dashboard answers at {base} ({reason}): is `bursar serve` running "
            "with its dashboard? Pass --url as it printed it",
            err=True,
        )
        sys.exit(EXIT_FAILED)
    click.echo(link)


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {exc.code}"
