"""Every ``bursar`` command lives in ``bursar.cli``: the installed entry point is its group,
and each command and subcommand answers ``--help``."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import click
import pytest
from click.testing import CliRunner

from bursar.cli.main import main


def _paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        out.append((*prefix, name))
        if isinstance(command, click.Group):
            out.extend(_paths(command, (*prefix, name)))
    return out


COMMANDS = _paths(main)


def test_the_installed_entry_point_is_the_cli_group() -> None:
    (script,) = entry_points(group="console_scripts", name="bursar")
    assert script.value == "bursar.cli.main:main"
    assert script.load() is main


def test_every_command_group_is_registered() -> None:
    top = {path[0] for path in COMMANDS}
    assert top == {
        "acquire",
        "campaigns",
        "config",
        "dashboard",
        "demo",
        "explain",
        "fidelity",
        "journal",
        "leases",
        "matrix",
        "policy",
        "release",
        "renew",
        "replay",
        "serve",
        "sim",
        "status",
        "supply",
        "traces",
        "whatif",
    }
    assert {
        ("journal", "audit"),
        ("sim", "run"),
        ("campaigns", "create"),
        ("policy", "apply"),
        ("policy", "show"),
    } <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_each_command_answers_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, [*path, "--help"], prog_name="bursar")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: bursar {' '.join(path)} ")


def test_python_m_broker_service_is_bursar_serve() -> None:
    # Benchmarks and the process tests start the service this way.
    result = subprocess.run(
        [sys.executable, "-m", "bursar.broker.service", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Serve the broker over gRPC" in result.stdout
