"""The CLI's conventions against a real `bursar serve` process: an explicit flag beats the
environment (and the environment that shaped an answer is named on stderr), tables are
whole when piped (and tab-separated with --tsv), a renewal that could only shorten a lease
says so, `acquire` knows a lease its command released, and a hint never repeats the
error."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from server import Server
from service_support import LIFECYCLE

from bursar.cli.main import _configure_logging, _StderrHandler, main
from bursar.providers.client import BrokerClient

ENV_KEYS = ("BURSAR_TARGET", "BURSAR_TOKEN", "BURSAR_TOKEN_FILE", "BURSAR_ADMIN_TOKEN_FILE")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("broker")
    cfg = root / "pool.toml"
    cfg.write_text(LIFECYCLE)
    with Server(root / "state", "--config", str(cfg), timeout_s=30) as s:
        yield s


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (*ENV_KEYS, "BURSAR_CAMPAIGN", "COLUMNS"):
        monkeypatch.delenv(key, raising=False)


def bursar(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def state(s: Server, name: str) -> str:
    return str(s.state_dir / name)


@pytest.fixture
def two_leases(broker: Server) -> Iterator[dict[str, str]]:
    """One live lease of sci's and one of other's."""
    tokens = broker.tokens()
    with (
        BrokerClient(broker.address, tokens["sci"]) as sci,
        BrokerClient(broker.address, tokens["other"]) as other,
    ):
        held = {
            "sci": sci.acquire({"gpu": 8}, 600, blocking=False).id,
            "other": other.acquire({"gpu": 8}, 600, blocking=False).id,
        }
        try:
            yield held
        finally:
            sci.release(held["sci"])
            other.release(held["other"])


def test_an_explicit_admin_token_is_not_filtered_by_the_environments_campaign(
    broker: Server, two_leases: dict[str, str]
) -> None:
    env = {
        "BURSAR_TARGET": broker.address,
        "BURSAR_TOKEN_FILE": state(broker, "tokens.json"),
        "BURSAR_CAMPAIGN": "sci",
    }
    # As the docs say to set up: the environment alone acts for sci, and says so.
    res = bursar("leases", "list", env=env)
    assert res.exit_code == 0, res.output
    assert two_leases["sci"] in res.stdout and two_leases["other"] not in res.stdout
    assert "campaign: sci (from BURSAR_CAMPAIGN)" in res.stderr
    assert f"token file: {state(broker, 'tokens.json')} (from BURSAR_TOKEN_FILE)" in res.stderr
    assert f"target: {broker.address} (from BURSAR_TARGET)" in res.stderr

    # An explicit admin token, on the group: every campaign's leases, and no header
    # naming a campaign that was set aside.
    admin = ["--admin-token-file", state(broker, "admin.token")]
    res = bursar("leases", *admin, "list", env=env)
    assert res.exit_code == 0, res.output
    assert two_leases["sci"] in res.stdout and two_leases["other"] in res.stdout
    assert "BURSAR_CAMPAIGN" not in res.stderr and "BURSAR_TOKEN_FILE" not in res.stderr
    # ... and with --json nothing but JSON anywhere.
    res = bursar("leases", "list", *admin, "--json", env=env)
    assert {x["id"] for x in json.loads(res.stdout)} >= set(two_leases.values())
    assert res.stderr == ""

    # Without BURSAR_CAMPAIGN the table in BURSAR_TOKEN_FILE would need one: the explicit
    # admin token sets that file aside instead of failing for want of --campaign.
    res = bursar("leases", *admin, "list", "--json", env={**env, "BURSAR_CAMPAIGN": ""})
    assert res.exit_code == 0, res.output
    assert {x["id"] for x in json.loads(res.stdout)} >= set(two_leases.values())

    # An explicit --campaign still filters the admin's view.
    res = bursar("leases", *admin, "--campaign", "other", "list", "--json", env=env)
    assert [x["id"] for x in json.loads(res.stdout)] == [two_leases["other"]]


def test_an_explicit_token_beats_the_environments_token_and_campaign(
    broker: Server, two_leases: dict[str, str]
) -> None:
    env = {
        "BURSAR_TOKEN": broker.tokens()["sci"],
        "BURSAR_CAMPAIGN": "sci",
        "BURSAR_TARGET": "127.0.0.1:1",  # nothing listens there
    }
    # --token-file (a bare token of other's) on the command line, --target on the group:
    # the environment's token, campaign and target are all set aside.
    bare = Path(state(broker, "other.token"))
    bare.write_text(broker.tokens()["other"] + "\n")
    res = bursar("leases", "--target", broker.address, "list", "--token-file", str(bare), env=env)
    assert res.exit_code == 0, res.output
    assert two_leases["other"] in res.stdout and two_leases["sci"] not in res.stdout
    assert res.stderr == ""

    # A table of tokens needs the campaign to pick its entry: the environment's is used,
    # and named.
    res = bursar(
        "status", "--target", broker.address, "--token-file", state(broker, "tokens.json"), env=env
    )
    assert res.exit_code == 0, res.output
    assert "campaign:sci" in res.stdout
    assert res.stderr == "campaign: sci (from BURSAR_CAMPAIGN)\n"


def test_piped_tables_are_whole_and_tsv_is_one_line_per_row(
    broker: Server, two_leases: dict[str, str]
) -> None:
    env = {**os.environ, "COLUMNS": ""}
    env.pop("COLUMNS")
    admin = ["--target", broker.address, "--admin-token-file", state(broker, "admin.token")]
    label = "experiment=" + "-".join(["a-long-run-name"] * 6)
    with BrokerClient(broker.address, broker.tokens()["sci"]) as sci:
        wide = sci.acquire({"gpu": 8}, 600, blocking=False, labels=dict([label.split("=")]))
        try:
            # A real pipe, as `bursar leases list | less` has: rich would size the table
            # to 80 columns, wrap the label and cut the headers short (`expir…`).
            out = subprocess.run(
                [sys.executable, "-m", "bursar.cli.main", "leases", *admin, "list"],
                capture_output=True,
                text=True,
                env=env,
                check=True,
                timeout=60,
            ).stdout
        finally:
            sci.release(wide.id)
    assert "…" not in out and "expires" in out, out
    row = next(line for line in out.splitlines() if line.lstrip().startswith(wide.id))
    assert label in row, out

    res = bursar("leases", *admin, "list", "--tsv")
    assert res.exit_code == 0, res.output
    header, *rows = res.stdout.splitlines()
    assert header.split("\t")[:3] == ["lease", "campaign", "state"]
    assert "expires" in header.split("\t")
    ids = {row.split("\t")[0] for row in rows}
    assert set(two_leases.values()) <= ids
    assert all(len(row.split("\t")) == len(header.split("\t")) for row in rows)

    res = bursar("leases", *admin, "list", "--tsv", "--json")
    assert res.exit_code == 2 and "pick one" in res.stderr

    # The journal's table too, read from the running broker's state directory.
    res = bursar("journal", "tail", "--state-dir", str(broker.state_dir), "-n", "5", "--tsv")
    assert res.exit_code == 0, res.output
    header, *rows = res.stdout.splitlines()
    assert len(rows) == 5 and header.startswith("seq\t")
    assert all(len(r.split("\t")) == len(header.split("\t")) for r in rows)


def test_a_renewal_that_could_only_shorten_says_so_and_exits_1(broker: Server) -> None:
    tokens = broker.tokens()
    sci = ["--target", broker.address, "--token", tokens["sci"]]
    with BrokerClient(broker.address, tokens["sci"]) as client:
        lease = client.acquire({"gpu": 8}, 360, blocking=False)
        try:
            res = bursar("renew", lease.id, "--duration", "100", *sci)
            assert res.exit_code == 1 and res.stdout == ""
            error, hint = res.stderr.splitlines()
            assert error.startswith(f"error: lease {lease.id} already runs to ")
            assert "(in 5m5" in error or "(in 6m00s)" in error
            assert error.endswith("a renewal never shortens a lease (WOULD_SHORTEN)")
            assert (
                hint == f"hint: to end it sooner, release it when done: bursar release {lease.id}"
            )
            assert client.get_lease(lease.id).expires_at == lease.expires_at  # nothing sent

            res = bursar("renew", lease.id, "--duration", "100", *sci, "--json")
            assert res.exit_code == 1
            assert json.loads(res.stderr)["error"]["reason"] == "WOULD_SHORTEN"

            res = bursar("renew", lease.id, "--duration", "900", *sci)  # longer: renewed
            assert res.exit_code == 0, res.output
            assert client.get_lease(lease.id).expires_at > lease.expires_at
        finally:
            client.release(lease.id)


def test_acquire_knows_its_command_released_the_lease(broker: Server) -> None:
    env = {
        "BURSAR_TARGET": broker.address,
        "BURSAR_TOKEN_FILE": state(broker, "tokens.json"),
        "BURSAR_CAMPAIGN": "sci",
    }
    release = f'{sys.executable} -m bursar.cli.main release "$BURSAR_LEASE_ID"'
    res = bursar("acquire", "--size", "gpu=8", "--", "sh", "-c", release, env=env)
    assert res.exit_code == 0, res.output
    assert "releasing" not in res.stderr and "; released L" not in res.stderr
    last = res.stderr.splitlines()[-1]
    assert last.startswith("bursar acquire: command exited with status 0; L")
    assert last.endswith("had already ended (released)"), last

    res = bursar("acquire", "--size", "gpu=8", "--", "true", env=env)
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines()[-1].startswith(
        "bursar acquire: command exited with status 0; released L"
    )


def test_an_error_is_one_line_and_a_hint_never_repeats_it(broker: Server) -> None:
    sci = ["--target", broker.address, "--token", broker.tokens()["sci"]]
    res = bursar("acquire", "--size", "gpu=64", "--timeout", "0", *sci, "--", "true")
    assert res.exit_code == 1
    errors = [ln for ln in res.stderr.splitlines() if not ln.startswith("bursar acquire:")]
    assert len(errors) == 1 and errors[0].startswith("error: size.gpu: 64.0 is larger")
    assert errors[0].endswith("(OUT_OF_RANGE)")  # one line: not wrapped at 80 columns

    res = bursar("renew", "L999", "--duration", "10", *sci)
    assert res.exit_code == 1
    error, hint = res.stderr.splitlines()
    assert "no lease 'L999'" in error and hint.startswith("hint: list what exists")


def test_grpc_pollers_wakeup_of_a_finished_loop_is_not_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """grpc.aio's process-wide poller may wake the loop of a command that has finished
    (`bursar acquire`); asyncio logs that as an error with a traceback on whatever runs
    next. It is not the user's to act on, so the CLI's stderr leaves it out; any other
    asyncio error still shows."""
    _configure_logging(logging.WARNING)
    log = logging.getLogger("asyncio")
    try:
        try:
            raise RuntimeError("Event loop is closed")
        except RuntimeError:
            log.error("Exception in callback PollerCompletionQueue._handle_events()", exc_info=True)
            log.error("Exception in callback Task.wakeup()", exc_info=True)
        err = capsys.readouterr().err
        assert "PollerCompletionQueue" not in err
        assert "Task.wakeup" in err and "Event loop is closed" in err
    finally:
        root = logging.getLogger()
        for h in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
            root.removeHandler(h)


def test_progress_lines_carry_no_source_location(tmp_path: Path) -> None:
    """`bursar whatif` says each arm is done on stderr: in words, without `whatif.py:131`."""
    trace = tmp_path / "tiny.swf"
    rows = [(0, 100, 4, 100, 1), (10, 50, 8, 60, 2), (20, 30, 2, 60, 3)]
    lines = ["; MaxProcs: 10", "; UnixStartTime: 0"]
    for i, (submit, run, procs, req, user) in enumerate(rows, 1):
        lines.append(f"{i} {submit} 0 {run} {procs} -1 -1 {procs} {req} -1 1 {user} 1 -1 1 1 -1 -1")
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    args = ["whatif", "--trace", str(trace), "--policy", "fifo", "--candidate", "policy=easy"]
    res = CliRunner().invoke(main, [*args, "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    done = [ln for ln in res.stderr.splitlines() if "done " in ln]
    assert done, res.stderr
    assert not any(".py:" in ln for ln in done), done
