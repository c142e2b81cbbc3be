"""A newcomer's path through the CLI: token files (a bare token or serve's tokens.json with
a campaign), tokens checked before anything is sent, serve's config discovery, the journal
naming what changed in a policy, and the Slurm-style verbs (acquire, release, renew,
status) against a real broker."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from client_support import ServerThread, server_thread, until
from hypothesis import given
from hypothesis import strategies as st

from bursar.broker.errors import JournalError
from bursar.broker.journal import Journal, spec_diff, spec_to_dict
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.cli.console import report_console
from bursar.cli.main import main
from bursar.cli.serve import discover_config
from bursar.providers.client import (
    BrokerClient,
    InvalidToken,
    check_token,
    read_token_file,
)

NOWHERE = "127.0.0.1:1"
"""A target nothing listens on: a command that exits 2 against it sent nothing."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state") as s:
        yield s


def bursar(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def tokens_json(s: ServerThread) -> str:
    return str(s.state_dir / "tokens.json")


def one_line_error(res: Result) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------
# Tokens


def test_tokens_json_with_a_campaign_by_option_or_environment(server: ServerThread) -> None:
    base = ["--target", server.address, "--token-file", tokens_json(server)]
    res = bursar("status", *base, "--campaign", "sci", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"]["caller"] == "campaign:sci"

    res = bursar("status", *base, "--json", env={"BURSAR_CAMPAIGN": "other"})
    assert json.loads(res.stdout)["status"]["caller"] == "campaign:other"

    # on the group too, as the help says
    res = bursar("leases", *base, "--campaign", "sci", "list", "--json")
    assert res.exit_code == 0, res.output and json.loads(res.stdout) == []


def test_tokens_json_with_one_entry_needs_no_campaign(server: ServerThread, tmp_path: Path) -> None:
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"other": server.tokens["other"]}))
    res = bursar("status", "--target", server.address, "--token-file", str(single), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"]["caller"] == "campaign:other"


def test_token_table_without_a_campaign_or_with_an_unknown_one(server: ServerThread) -> None:
    base = ["--target", NOWHERE, "--token-file", tokens_json(server)]
    line = one_line_error(bursar("leases", *base, "list"))
    assert "backfill, other, sci" in line and "--campaign" in line
    line = one_line_error(bursar("leases", *base, "--campaign", "storm", "list"))
    assert "no token for campaign 'storm'" in line and "backfill, other, sci" in line


def test_json_passed_as_a_token_fails_before_anything_is_sent(server: ServerThread) -> None:
    table = Path(tokens_json(server)).read_text()
    line = one_line_error(bursar("leases", "--target", NOWHERE, "--token", table, "list"))
    assert "is not a token" in line and "JSON" in line and "tokens.json" in line
    line = one_line_error(bursar("status", "--target", NOWHERE, env={"BURSAR_TOKEN": table}))
    assert "BURSAR_TOKEN" in line


def test_a_token_file_with_an_illegal_character(tmp_path: Path) -> None:
    bad = tmp_path / "bad.token"
    bad.write_text("bsr_abc\x07def\n")
    line = one_line_error(bursar("status", "--target", NOWHERE, "--token-file", str(bad)))
    assert str(bad) in line and "'\\x07'" in line


def test_campaigns_take_campaign_with_a_token_table(server: ServerThread) -> None:
    """The option is accepted; a campaign token is still not the admin's."""
    res = bursar(
        "campaigns",
        "--target",
        server.address,
        "--token-file",
        tokens_json(server),
        "--campaign",
        "sci",
        "list",
    )
    assert res.exit_code == 1 and "No such option" not in res.output
    assert "admin token" in res.stderr and "Traceback" not in res.output


def test_a_token_table_as_the_admin_token_file(server: ServerThread) -> None:
    line = one_line_error(
        bursar("campaigns", "--target", NOWHERE, "--admin-token-file", tokens_json(server), "list")
    )
    assert "not the admin token" in line and "admin.token" in line


def test_another_campaigns_lease_is_refused_without_a_traceback(server: ServerThread) -> None:
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        lease = sci.acquire({"gpu": 8}, 60, blocking=False)
        res = bursar(
            "release",
            lease.id,
            "--target",
            server.address,
            "--token-file",
            tokens_json(server),
            "--campaign",
            "other",
        )
        assert res.exit_code == 1 and "Traceback" not in res.output
        assert res.stderr.startswith("error: ") and "hint: " in res.stderr
        assert sci.get_lease(lease.id).ended_at is None


def test_a_bare_token_named_for_another_campaign_is_refused_not_ignored(
    server: ServerThread, tmp_path: Path
) -> None:
    bare = tmp_path / "sci.token"
    bare.write_text(server.tokens["sci"] + "\n")
    base = ["--target", server.address, "--token-file", str(bare)]
    res = bursar("status", *base, "--campaign", "other")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "'sci', not 'other'" in res.stderr and "OTHER_CAMPAIGN" in res.stderr
    res = bursar("status", *base, "--campaign", "sci", "--json")
    assert json.loads(res.stdout)["status"]["caller"] == "campaign:sci"


def test_the_library_refuses_an_unsendable_token_at_construction(tmp_path: Path) -> None:
    with pytest.raises(InvalidToken, match="JSON"):
        BrokerClient(NOWHERE, '{"sci": "bsr_x"}')
    table = tmp_path / "tokens.json"
    table.write_text(json.dumps({"a": "bsr_1", "b": "bsr_2"}))
    assert read_token_file(table, "b") == "bsr_2"
    with pytest.raises(InvalidToken, match="several campaigns"):
        read_token_file(table)
    table.write_text('{"a": 1}')
    with pytest.raises(InvalidToken, match="not a token table"):
        read_token_file(table)


_TOKEN = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1)


@given(_TOKEN.filter(lambda t: not t.startswith("{")))
def test_every_sendable_token_is_kept_as_is(token: str) -> None:
    assert check_token(token) == token


@given(_TOKEN, st.characters(exclude_characters=[chr(c) for c in range(0x21, 0x7F)]), _TOKEN)
def test_a_token_with_any_other_character_is_refused(a: str, bad: str, b: str) -> None:
    with pytest.raises(InvalidToken, match="is not a token"):
        check_token(a + bad + b)


# ---------------------------------------------------------------------------------------
# serve's config


def test_serve_config_order(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    mine = tmp_path / "mine.toml"
    mine.write_text("")
    env_named = tmp_path / "env.toml"
    env_named.write_text("")
    env = {"BURSAR_CONFIG": str(env_named)}
    assert discover_config(mine, env, site) == (mine, "--config")
    assert discover_config(None, env, site) == (env_named, "$BURSAR_CONFIG")
    assert discover_config(None, {}, site) == (None, "the packaged demo pool")
    site.write_text("")
    assert discover_config(None, {"BURSAR_CONFIG": ""}, site) == (site, str(site))
    with pytest.raises(ValueError, match="BURSAR_CONFIG names"):
        discover_config(None, {"BURSAR_CONFIG": str(tmp_path / "missing.toml")}, site)
    help_text = bursar("serve", "--help").stdout
    assert "$BURSAR_CONFIG" in help_text and "/etc/bursar/bursar.toml" in help_text


# ---------------------------------------------------------------------------------------
# A policy changed under a journal


def test_a_changed_policy_names_each_key_with_both_values(tmp_path: Path) -> None:
    pool = PoolSpec(groups=(NodeGroup(count=1, resources={"gpu": 8}, warm=1),))
    path = tmp_path / "journal.sqlite"
    with Journal.open(path, pool, PolicySpec(grace_s=30.0)):
        pass
    with pytest.raises(JournalError) as err:
        Journal.open(path, pool, PolicySpec(grace_s=45.0, min_retry_s=2.0))
    text = str(err.value)
    assert "grace_s: in force 30.0, given 45.0" in text
    assert "min_retry_s: in force" in text and "given 2.0" in text
    assert "--state-dir" in text and '"grace_s"' not in text  # no dump of the whole spec
    assert "bursar policy apply --state-dir" in text  # the way forward keeps the state


def test_spec_diff_finds_exactly_the_changed_leaves() -> None:
    a = spec_to_dict(PolicySpec())
    b = spec_to_dict(PolicySpec(grace_s=1.0))
    assert spec_diff(a, b) == [("grace_s", a["grace_s"], 1.0)]
    assert spec_diff(a, a) == []
    assert spec_diff({"x": {"y": 1}}, {"x": {"z": 2}}) == [("x.y", 1, None), ("x.z", None, 2)]


# ---------------------------------------------------------------------------------------
# The verbs


def sci_args(s: ServerThread) -> list[str]:
    return ["--target", s.address, "--token-file", tokens_json(s), "--campaign", "sci"]


def test_acquire_runs_the_command_in_the_lease_and_exits_with_its_status(
    server: ServerThread, tmp_path: Path
) -> None:
    seen = tmp_path / "env.txt"
    script = (
        f"import os; open({str(seen)!r}, 'w').write(' '.join(os.environ[k] for k in "
        "('BURSAR_LEASE_ID', 'BURSAR_LEASE_NODES', 'BURSAR_LEASE_SIZE'))); raise SystemExit(3)"
    )
    res = bursar(
        "acquire",
        "--size",
        "gpu=8",
        "--label",
        "job=train",
        *sci_args(server),
        "--",
        sys.executable,
        "-c",
        script,
    )
    assert res.exit_code == 3, res.output
    lease_id, nodes, size = seen.read_text().split()
    assert nodes.startswith("w") and size == "gpu=8"
    assert "waiting for a lease of gpu=8" in res.stderr
    assert f"command exited with status 3; released {lease_id}" in res.stderr
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        ended = sci.get_lease(lease_id)
        assert ended.state.value == "RELEASED" and dict(ended.labels) == {"job": "train"}


def test_acquire_that_cannot_be_granted_exits_1(server: ServerThread) -> None:
    res = bursar("acquire", "--size", "gpu=64", "--timeout", "0", *sci_args(server), "--", "true")
    assert res.exit_code == 1 and res.stderr.count("error: ") == 1


def test_acquire_forwards_sigterm_then_releases(server: ServerThread, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "bursar.cli.main", "acquire", "--size", "gpu=8"),
            *sci_args(server),
            *("--", sys.executable, "-c", child),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        until(ready.exists, 20, "the command running in the lease")
        with BrokerClient(server.address, server.tokens["sci"]) as sci:
            (held,) = sci.list_leases()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 7
            assert sci.get_lease(held.id).state.value == "RELEASED"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stderr is not None and "status 7" in proc.stderr.read()


def test_renew_release_and_status(server: ServerThread) -> None:
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        lease = sci.acquire({"gpu": 8}, 60, blocking=False)
        res = bursar("status", *sci_args(server))
        assert res.exit_code == 0, res.output
        assert "campaign:sci" in res.stdout and "1, holding gpu=8" in res.stdout
        assert "e+09" not in res.stdout

        t0 = time.time()
        res = bursar("renew", lease.id, "--duration", "1800", *sci_args(server), "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["expires_at"] >= t0 + 1800 - 1
        res = bursar("renew", lease.id, "--duration", "3000", *sci_args(server))
        assert res.stdout.startswith(f"lease {lease.id} (sci): gpu=8, active")
        assert "(in 49m" in res.stdout or "(in 50m" in res.stdout

        res = bursar("release", lease.id, *sci_args(server))
        assert res.exit_code == 0 and "released; ended" in res.stdout
        assert sci.get_lease(lease.id).state.value == "RELEASED"
        res = bursar("status", *sci_args(server), "--json")
        assert json.loads(res.stdout)["campaign"]["leases"] == []


# ---------------------------------------------------------------------------------------
# Small things


def test_report_tables_wrap_instead_of_cutting_off_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rich.table import Table

    table = Table("claim", "measured")
    long_claim = "a guaranteed campaign's p95 latency stays under its bound " * 2
    table.add_row(long_claim.strip(), "1.23 s")
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    report_console(buf).print(table)
    assert long_claim.strip() in buf.getvalue() and "…" not in buf.getvalue()
    monkeypatch.setenv("COLUMNS", "90")
    assert report_console(io.StringIO()).width == 90


def test_sim_experiments_without_dask_gives_an_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes the import fail as a missing package does.
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    res = CliRunner().invoke(
        main, ["sim", "experiments", "--quick", "--sweep", "headroom", "--out", str(tmp_path)]
    )
    assert res.exit_code == 1 and res.exception is not None
    assert "pip install 'bursar-broker[dask]'" in res.stderr
    assert "Traceback" not in res.output and len(res.stderr.strip().splitlines()) == 1


def test_the_commands_environment_and_a_slurm_leases_allocation() -> None:
    from bursar.cli.acquire import lease_env
    from bursar.protos.bursar.v1 import broker_pb2 as pb
    from bursar.providers.client import Lease
    from bursar.providers.launch import launch_argv

    wire = pb.Lease(
        lease_id="L7",
        campaign="sci",
        size={"gpu": 16.0},
        nodes=["n001", "n002"],
        expires_at=1_750_000_600.0,
        allocation={"backend": "slurm", "job_id": "4242", "node_count": "2"},
    )
    lease = Lease.from_proto(wire)
    env = lease_env(lease, {"HOME": "/home/u", "BURSAR_LEASE_ID": "stale"})
    assert env["HOME"] == "/home/u" and env["BURSAR_LEASE_ID"] == "L7"
    assert env["BURSAR_LEASE_NODES"] == "n001,n002" and env["BURSAR_LEASE_SIZE"] == "gpu=16"
    assert env["SLURM_JOB_ID"] == "4242" and env["BURSAR_LEASE_EXPIRES_AT"] == "1750000600.000"
    assert launch_argv(lease, ["./train"])[:2] == ["srun", "--jobid=4242"]
    local = Lease.from_proto(pb.Lease(lease_id="L8", campaign="sci", nodes=["w000"]))
    assert "SLURM_JOB_ID" not in lease_env(local, {})


def test_a_waiting_acquire_says_so_until_it_times_out(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bursar.cli.acquire as acquire

    monkeypatch.setattr(acquire, "WAIT_NOTICE_S", 0.2)
    monkeypatch.setattr(acquire, "QUEUED_POLL_S", 0.1)
    with BrokerClient(server.address, server.tokens["other"]) as other:
        other.acquire({"gpu": 16}, 60, blocking=False)  # the warm nodes
        res = bursar(
            "acquire", "--size", "gpu=16", "--timeout", "1.5", *sci_args(server), "--", "true"
        )
    assert res.exit_code == 1, res.output
    assert "still waiting for the grant" in res.stderr and "error: " in res.stderr
    # Why it waits and for how long, once (nothing changed while it waited).
    queued = [ln for ln in res.stderr.splitlines() if "queued as L" in ln]
    assert len(queued) == 1, res.stderr
    assert "POOL_FULL, estimated wait " in queued[0] and "position 1" in queued[0]
