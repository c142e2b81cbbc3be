"""`bursar serve --backend slurm` as a real process in front of a real Slurm cluster: leases
over gRPC carry their allocation; kill -9 and restart re-adopts the live allocations, ends
the leases whose allocations vanished meanwhile, and cancels the jobs of no lease."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from client_support import until
from server_support import Server
from slurm_support import (
    job_prefix_fixture,  # noqa: F401  (fixtures: job_prefix, slurm_cluster)
    job_state,
    salloc,
    slurm_cluster_fixture,  # noqa: F401
    slurm_config_text,
)

from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.cli.main import main
from bursar.providers.client import Backoff, BrokerClient, LeaseState
from bursar.providers.launch import launch_argv

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

FAST = Backoff(initial_s=0.05, max_s=0.5)


def test_kill_9_and_restart_readopts_allocations_and_cancels_orphans(
    tmp_path: Path, job_prefix: str
) -> None:
    cfg = tmp_path / "site.toml"
    cfg.write_text(slurm_config_text(job_prefix))
    state = tmp_path / "state"
    first = Server(state, "--backend", "slurm", "--config", str(cfg))
    try:
        token = first.tokens()["sci"]
        with BrokerClient(first.address, token, backoff=FAST) as c:
            keep = c.acquire({"gpu": 4, "cpu": 4}, 600, blocking=False)
            gone = c.acquire({"gpu": 8}, 600, blocking=False)
        assert keep.allocation["backend"] == "slurm" and keep.allocation["het_groups"] == "1"
        keep_job, gone_job = int(keep.allocation["job_id"]), int(gone.allocation["job_id"])
        assert job_state(keep_job) == job_state(gone_job) == "RUNNING"
        # A worker runs inside the lease's allocation, with its GPUs.
        out = subprocess.run(
            launch_argv(keep, ["bash", "-c", 'echo "$SLURM_JOB_ID $CUDA_VISIBLE_DEVICES"']),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert out.stdout.split() == [str(keep_job), "0,1,2,3"]
        assert first.kill(signal.SIGKILL) == -signal.SIGKILL
    finally:
        first.close()

    # While the broker is down: an admin cancels one allocation, and a job with the broker's
    # prefix that belongs to no lease appears (say, from an earlier broker).
    subprocess.run(["scancel", str(gone_job)], check=True)
    orphan = salloc(f"{job_prefix}-L999", "-w", "node4", "-c", "1")

    second = Server(state, "--backend", "slurm", "--config", str(cfg))
    try:
        until(lambda: job_state(orphan) != "RUNNING", 10, "the orphan to be cancelled")
        with BrokerClient(second.address, token, backoff=FAST) as c:
            kept = c.get_lease(keep.id)
            assert kept.state is LeaseState.ACTIVE
            assert kept.allocation["job_id"] == str(keep_job)  # re-adopted, not re-made
            assert job_state(keep_job) == "RUNNING"
            ended = until(
                lambda: (lambda ls: ls if ls.state is LeaseState.REVOKED else None)(
                    c.get_lease(gone.id)
                ),
                10,
                "the lease whose allocation vanished to end",
            )
            assert "gone while the broker was down" in ended.end_cause
            # A release after the restart still cancels the re-adopted allocation.
            c.release(keep.id)
        until(lambda: job_state(keep_job) != "RUNNING", 10, "the released allocation to end")
    finally:
        second.kill(signal.SIGTERM)
        second.close()
    with Journal.open(state / JOURNAL_FILENAME) as j:
        kinds = [e for _, e, _ in j.raw_entries() if '"kind":"lease_lost"' in e]
    assert len(kinds) == 1
    # The journal, backend events included, re-derives every decision.
    audit = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(state)])
    assert audit.exit_code == 0, audit.output


def test_serve_backend_slurm_needs_a_config_and_names_a_bad_partition(
    tmp_path: Path, job_prefix: str
) -> None:
    r = CliRunner().invoke(main, ["serve", "--backend", "slurm", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "--backend slurm needs --config FILE" in r.output
    cfg = tmp_path / "bad.toml"
    cfg.write_text(slurm_config_text(job_prefix).replace('"debug"', '"gpu"'))
    r = CliRunner().invoke(
        main, ["serve", "--backend", "slurm", "--config", str(cfg), "--state-dir", str(tmp_path)]
    )
    assert r.exit_code == 2
    assert "bad.toml" in r.output and "slurm.partition" in r.output
    assert "allowed: debug" in r.output
