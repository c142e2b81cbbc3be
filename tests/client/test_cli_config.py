"""The top-level ``bursar`` group and ``bursar config ...``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bursar.broker.config import default_config, default_config_text, load_config
from bursar.cli.main import main


@pytest.fixture
def runner() -> Iterator[CliRunner]:
    # The group configures the root logger; put it back for the tests that follow.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield CliRunner()
    root.setLevel(level)
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)


def test_help_explains_bursar_and_lists_commands(runner: CliRunner) -> None:
    out = runner.invoke(main, ["--help"])
    assert out.exit_code == 0
    assert "agent resource broker" in out.output
    for command in ("config", "journal"):
        assert command in out.output


def test_version(runner: CliRunner) -> None:
    out = runner.invoke(main, ["--version"])
    assert out.exit_code == 0
    assert out.output.startswith("bursar, version ")


@pytest.mark.parametrize(("args", "level"), [([], logging.WARNING), (["-v"], logging.INFO),
                                             (["-vv"], logging.DEBUG), (["-vvv"], logging.DEBUG)])  # fmt: skip
def test_verbosity_sets_log_level(runner: CliRunner, args: list[str], level: int) -> None:
    out = runner.invoke(main, [*args, "config", "show-default"])
    assert out.exit_code == 0
    assert logging.getLogger().level == level


def test_verbose_logs_go_to_stderr(runner: CliRunner) -> None:
    @main.command("_log_probe", hidden=True)
    def probe() -> None:
        logging.getLogger("bursar.test").info("probe message")

    try:
        quiet = runner.invoke(main, ["_log_probe"])
        loud = runner.invoke(main, ["-v", "_log_probe"])
    finally:
        main.commands.pop("_log_probe")
    assert "probe message" not in quiet.output
    assert "probe message" in loud.stderr


def test_check_summarises_the_demo(runner: CliRunner) -> None:
    path = Path(__file__).parents[2] / "broker" / "demo.toml"
    out = runner.invoke(main, ["config", "check", str(path)])
    assert out.exit_code == 0, out.output
    for text in ("node000..node063", "512", "fs_bw", "inference", "adaptive-sci",
                 "opportunistic", "preemptible", "unlimited", "valid Bursar config"):  # fmt: skip
        assert text in out.output
    # Fits an 80-column terminal (the runner's width): nothing truncated.
    assert "…" not in out.output


def test_check_bad_file_exits_2_with_key_and_allowed_values(
    runner: CliRunner, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(default_config_text().replace('"prepaid"', '"postpaid"'), encoding="utf-8")
    out = runner.invoke(main, ["config", "check", str(bad)])
    assert out.exit_code == 2
    assert f"{bad}: policy.enforcement:" in out.output
    assert "allowed: prepaid, grant_instant" in out.output


def test_check_missing_file_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    out = runner.invoke(main, ["config", "check", str(tmp_path / "nope.yaml")])
    assert out.exit_code == 2
    assert "no such file" in out.output


def test_show_default_round_trips(runner: CliRunner, tmp_path: Path) -> None:
    out = runner.invoke(main, ["config", "show-default"])
    assert out.exit_code == 0
    assert out.output == default_config_text()
    copy = tmp_path / "mine.toml"
    copy.write_text(out.output, encoding="utf-8")
    assert load_config(copy) == default_config()


EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize(
    ("name", "backend", "shown"),
    [("local.toml", "local", "local000"),  # this machine's first node
     ("slurm.toml", "slurm", "discovered from Slurm partition gpu when served")],
)  # fmt: skip
def test_check_accepts_each_example_config_for_its_backend(
    runner: CliRunner, name: str, backend: str, shown: str
) -> None:
    out = runner.invoke(main, ["config", "check", str(EXAMPLES / name)])
    assert out.exit_code == 0, out.output
    assert shown in out.output and "adaptive-sci" in out.output
    assert f"valid Bursar config for the {backend} backend" in out.output
    assert "from the file's backend key" in out.output


def test_check_without_a_backend_key_is_for_the_simulated_backend(runner: CliRunner) -> None:
    path = Path(__file__).parents[2] / "broker" / "demo.toml"
    out = runner.invoke(main, ["config", "check", str(path)])
    assert "valid Bursar config for the simulated backend (the default" in out.output


def test_check_for_local_refuses_a_demo_derived_file_in_local_terms(
    runner: CliRunner, tmp_path: Path
) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(default_config_text(), encoding="utf-8")
    out = runner.invoke(main, ["config", "check", "--backend", "local", str(mine)])
    assert out.exit_code == 2
    assert f"{mine}: pool.groups: the local backend discovers the nodes" in out.output
    assert "also policy.power_down_idle_s" in out.output and "Slurm" not in out.output
    assert "(checked for the local backend, from --backend)" in out.output


def test_check_backend_flag_wins_over_the_files_key(runner: CliRunner) -> None:
    out = runner.invoke(
        main, ["config", "check", "--backend", "simulated", str(EXAMPLES / "local.toml")]
    )
    assert out.exit_code == 2
    assert "local.toml: pool: required key is missing" in out.output
    assert "(checked for the simulated backend, from --backend)" in out.output


def test_check_names_the_allowed_backends(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('backend = "k8s"\n', encoding="utf-8")
    out = runner.invoke(main, ["config", "check", str(bad)])
    assert out.exit_code == 2
    assert f"{bad}: backend: unknown value 'k8s'; allowed: simulated, local, slurm" in out.output
    flag = runner.invoke(main, ["config", "check", "--backend", "k8s", str(bad)])
    assert flag.exit_code == 2 and "'simulated', 'local', 'slurm'" in flag.output
