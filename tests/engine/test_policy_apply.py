"""Admin.ApplyPolicy and GetPolicy over real gRPC, and ``bursar policy`` on a stopped
broker's state directory: a dry run answers the diff and journals nothing, an apply
journals one entry the audit replays, a bad or forbidden change is refused naming the key
and changes nothing, and only the admin token may call them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from service_support import LIFECYCLE, run, serve

from bursar.broker.audit import audit
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.broker.policy import PolicySpec
from bursar.cli.main import main
from bursar.providers.client import (
    AsyncAdminClient,
    Backoff,
    InvalidArgument,
    PermissionDenied,
)

FAST = Backoff(initial_s=0.05, max_s=0.3)


def test_dry_run_apply_and_get_policy(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path) as c,
            AsyncAdminClient(c.address, c.admin_token, backoff=FAST) as admin,
        ):
            start = await admin.get_policy()
            assert start.changed_at == 0 and start.spec["grace_s"] == 0.6
            before = c.journal_len()

            dry = await admin.apply_policy(toml="[policy]\ngrace_s = 5\n", dry_run=True)
            assert [(x.key, x.old, x.new) for x in dry.changes] == [("grace_s", 0.6, 5.0)]
            assert not dry.applied and dry.seq == 0 and dry.policy.spec["grace_s"] == 5.0
            assert c.journal_len() == before
            assert c.core.engine.policy.grace_s == 0.6

            done = await admin.apply_policy(toml="[policy]\ngrace_s = 5\nprice_k = 3\n")
            assert [x.key for x in done.changes] == ["grace_s", "price_k"]
            assert done.applied and done.seq == before + 1
            assert c.core.engine.policy.grace_s == 5.0
            now = await admin.get_policy()
            assert now.changed_at == done.seq and now.spec["price_k"] == 3.0

            # The whole policy in the journal's spelling; the same again changes nothing.
            again = await admin.apply_policy(spec_json=json.dumps(now.spec))
            assert not again.applied and not again.changes
            assert c.journal_len() == done.seq

    run(scenario())
    with Journal.open(tmp_path / JOURNAL_FILENAME) as j:
        assert j.current_policy.grace_s == 5.0 and j.policy.grace_s == 0.6
        kinds = [json.loads(e)["kind"] for _, e, _ in j.raw_entries()]
        assert kinds.count("apply_policy") == 1
        report = audit(j)
        assert report.ok, report


@pytest.mark.parametrize(
    ("toml", "key", "text"),
    [
        ("[policy]\ngrace_s = -1\n", "policy.grace_s", "allowed: numbers >= 0"),
        ("[policy]\nenforcement = 'grant_instant'\n", "policy.enforcement", "cannot change"),
        ("[policy]\nfairshare_half_life_s = 60\n", "policy.fairshare_half_life_s", "new state"),
        ("[policy]\nreservations = 0\n", "policy.reservations", ">= 1"),
        ("[policy]\nelastic_rule = 'fifo'\n", "policy.elastic_rule", "dmug"),
        ("[policy.warm_headroom]\ngpu = 99\n", "policy.warm_headroom.gpu", "allowed: 0 to 24"),
        ("[policy]\nbogus = 1\n", "policy.bogus", "unknown key"),
        ("[pool]\n", "toml", "no [policy] table"),
    ],
)
def test_a_bad_change_is_refused_naming_the_key_and_journals_nothing(
    tmp_path: Path, toml: str, key: str, text: str
) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path) as c,
            AsyncAdminClient(c.address, c.admin_token, backoff=FAST) as admin,
        ):
            before, policy = c.journal_len(), c.core.engine.policy
            for dry_run in (True, False):
                with pytest.raises(InvalidArgument) as err:
                    await admin.apply_policy(toml=toml, dry_run=dry_run)
                assert key in str(err.value) and text in str(err.value)
            assert c.journal_len() == before and c.core.engine.policy == policy

    run(scenario())


def test_only_the_admin_token_may_read_or_change_the_policy(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path) as c,
            AsyncAdminClient(c.address, c.tokens["sci"], backoff=FAST) as not_admin,
        ):
            before = c.journal_len()
            with pytest.raises(PermissionDenied):
                await not_admin.apply_policy(toml="[policy]\ngrace_s = 5\n")
            with pytest.raises(PermissionDenied):
                await not_admin.get_policy()
            assert c.journal_len() == before

    run(scenario())


def _stopped_broker(tmp_path: Path) -> Path:
    """A state directory a broker served (with the LIFECYCLE config) and left."""
    state = tmp_path / "state"

    async def scenario() -> None:
        async with serve(state):
            pass

    run(scenario())
    return state


def test_policy_apply_on_a_stopped_broker_journals_the_change(tmp_path: Path) -> None:
    state = _stopped_broker(tmp_path)
    new = tmp_path / "new.toml"
    new.write_text(LIFECYCLE.replace("grace_s = 0.6", "grace_s = 5"))
    runner = CliRunner()
    with Journal.open(state / JOURNAL_FILENAME) as j:
        before = j.last_seq

    dry = runner.invoke(
        main, ["policy", "apply", "--state-dir", str(state), "--config", str(new), "--dry-run"]
    )
    assert dry.exit_code == 0, dry.output
    assert "grace_s  0.6 -> 5.0" in dry.output and "nothing journaled" in dry.output
    with Journal.open(state / JOURNAL_FILENAME) as j:
        assert j.last_seq == before

    done = runner.invoke(main, ["policy", "apply", "--state-dir", str(state), "--config", str(new)])
    assert done.exit_code == 0, done.output
    assert f"applied at journal entry {before + 1}" in done.output
    shown = runner.invoke(main, ["policy", "show", "--state-dir", str(state)])
    assert shown.exit_code == 0, shown.output
    assert "grace_s" in shown.output and "5.0" in shown.output
    assert f"last changed at journal entry {before + 1}" in shown.output

    # A forbidden change is refused, naming the key, and journals nothing.
    bad = tmp_path / "bad.toml"
    bad.write_text(LIFECYCLE.replace("grace_s = 0.6", "grace_s = 5\nenforcement = 'grant_instant'"))
    refused = runner.invoke(
        main, ["policy", "apply", "--state-dir", str(state), "--config", str(bad)]
    )
    assert refused.exit_code == 2
    assert "policy.enforcement" in refused.output and "cannot change" in refused.output
    with Journal.open(state / JOURNAL_FILENAME) as j:
        assert j.last_seq == before + 1
        assert j.current_policy.grace_s == 5.0
        assert audit(j).ok
    audited = runner.invoke(main, ["journal", "audit", "--state-dir", str(state)])
    assert audited.exit_code == 0, audited.output

    # The broker starts with the new config, and keeps the lifecycle's campaigns.
    async def restarted() -> None:
        from bursar.broker.config import load_config

        async with serve(state, load_config(new)) as c:
            assert c.core.engine.policy.grace_s == 5.0
            assert sorted(c.core.engine.campaigns)

    run(restarted())
    assert PolicySpec().grace_s == 30.0  # the default is untouched by any of this
