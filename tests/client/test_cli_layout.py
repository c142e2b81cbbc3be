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


def test_each_command_is_registered_under_its_own_name() -> None:
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name, name


def test_a_command_imports_its_own_module_only() -> None:
    # The group loads a command's module when the command is asked for: `bursar serve`
    # does not import the simulator, the replay or the demo first.
    code = (
        "import sys\n"
        "from bursar.cli.main import main\n"
        "main(['serve', '--help'], standalone_mode=False)\n"
        "print(sorted(m for m in sys.modules if m.startswith('bursar.cli.')))\n"
        "print('bursar.sim.replay' in sys.modules, 'bursar.sim.demo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out[-2] == "['bursar.cli.main', 'bursar.cli.serve']", out
    assert out[-1] == "False False", out


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
