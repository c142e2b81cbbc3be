"""BursarProvider's contract, block by block, against a real broker over gRPC: what Parsl
is told (JobState and message) for each lease outcome, with plain shell commands in
place of Parsl's worker pool."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from client_support import ServerThread, server_thread, until
from parsl.executors.high_throughput.errors import ManagerLost
from parsl.jobs.states import JobState, JobStatus
from parsl.launchers import SimpleLauncher
from parsl_support import alive, parsl_config

from bursar.providers.client import Backoff, BrokerClient, LeaseState, Supply
from bursar.providers.parsl import (
    BursarProvider,
    fit_to_warm,
    lease_error_handler,
    lease_retry_handler,
)

FAST = Backoff(initial_s=0.05, max_s=0.3)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state", cfg=parsl_config()) as s:
        yield s


def provider(server: ServerThread, campaign: str, tmp_path: Path, **kw: object) -> BursarProvider:
    p = BursarProvider(
        broker=server.address,
        campaign=campaign,
        token=server.tokens[campaign],
        launcher=SimpleLauncher(),
        backoff=FAST,
        **kw,  # type: ignore[arg-type]
    )
    p.script_dir = str(tmp_path / "scripts")
    return p


def state(p: BursarProvider, job: str) -> JobStatus:
    return p.status([job])[0]


def test_a_block_runs_on_its_lease_and_cancel_releases_it(
    server: ServerThread, tmp_path: Path
) -> None:
    p = provider(server, "wf", tmp_path, resources_per_block={"cpu": 2, "mem_gb": 4, "gpu": 1})
    env_file = tmp_path / "env"
    try:
        job = p.submit(
            f"env > {env_file}; sleep 60 # --available-accelerators", 1, "parsl.t.block-0"
        )
        until(lambda: state(p, job).state is JobState.RUNNING, what="RUNNING")
        until(env_file.exists)
        until(lambda: "BURSAR_LEASE_ID" in env_file.read_text())
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
        lease_id = p.lease_id(job)
        assert env["BURSAR_LEASE_ID"] == lease_id and lease_id in state(p, job).message
        assert env["PARSL_CORES"] == "2" and env["PARSL_MEMORY_GB"] == "4"
        assert env["BURSAR_CAMPAIGN"] == "wf" and env["BURSAR_LEASE_NODES"]
        # The lease's GPU became the pool's accelerator list.
        script = next((tmp_path / "scripts").glob("*.sh")).read_text()
        assert "--available-accelerators 0" in script
        pid = p.resources[job].proc.pid  # type: ignore[union-attr]

        assert p.cancel([job]) == [True]
        st = state(p, job)
        assert st.state is JobState.CANCELLED and "released" in st.message
        assert not alive(pid)
        assert p.cancel([job]) == [True]  # idempotent
        assert p.cancel(["nope"]) == [False]
        with BrokerClient(server.address, server.tokens["wf"]) as c:
            assert c.get_lease(lease_id).state is LeaseState.RELEASED
            assert c.list_leases() == []
    finally:
        p.close()


def test_a_refused_block_stays_pending_with_the_reason_then_starts(
    server: ServerThread, tmp_path: Path
) -> None:
    p = provider(server, "capped", tmp_path, resources_per_block={"cpu": 2}, max_retry_s=0.3)
    try:
        first = p.submit("sleep 60", 1, "parsl.t.block-0")
        second = p.submit("sleep 60", 1, "parsl.t.block-1")
        until(lambda: state(p, first).state is JobState.RUNNING)
        st = state(p, second)
        assert st.state is JobState.PENDING and "ABOVE_BURST" in st.message, st.message
        assert p.lease_id(second) == ""
        until(lambda: p.resources[second].attempts >= 2, what="a retry")
        assert state(p, second).state is JobState.PENDING
        p.cancel([first])
        until(lambda: state(p, second).state is JobState.RUNNING, what="second block RUNNING")
        assert p.lease_id(second)
    finally:
        p.close()
    with BrokerClient(server.address, server.tokens["capped"]) as c:
        assert c.list_leases() == []


def test_a_preempted_block_drains_and_is_cancelled_never_failed(
    server: ServerThread, tmp_path: Path
) -> None:
    p = provider(server, "wf", tmp_path, resources_per_block={"cpu": 4})
    try:
        job = p.submit("sleep 60", 1, "parsl.t.block-0")
        until(lambda: state(p, job).state is JobState.RUNNING)
        pid = p.resources[job].proc.pid  # type: ignore[union-attr]
        lease_id = p.lease_id(job)
        with BrokerClient(server.address, server.tokens["hi"], backoff=FAST) as hi:
            hi.acquire({"cpu": 2}, 30, blocking=False)  # reclaim path: wf's lease is warned
            until(lambda: state(p, job).state is JobState.CANCELLED, 5, "CANCELLED")
            st = state(p, job)
            assert "preempted" in st.message and "drained" in st.message, st.message
            assert not alive(pid)
            assert p.ended_by_broker(job)
            with BrokerClient(server.address, server.tokens["wf"]) as c:
                assert c.get_lease(lease_id).ended
    finally:
        p.close()


def test_an_expired_lease_is_a_timeout(server: ServerThread, tmp_path: Path) -> None:
    # Renewals are refused (the bucket holds one lease's worth): the lease expires.
    p = provider(server, "poor", tmp_path, resources_per_block={"cpu": 1}, walltime=2)
    try:
        job = p.submit("sleep 60", 1, "parsl.t.block-0")
        until(lambda: state(p, job).state is JobState.RUNNING)
        until(lambda: state(p, job).terminal, 10, "the end of the lease")
        st = state(p, job)
        assert st.state is JobState.TIMEOUT and "expired" in st.message, st.message
        assert p.ended_by_broker(job)
        assert not alive(p.resources[job].proc.pid)  # type: ignore[union-attr]
        # The bucket is spent: the next block waits, PENDING, with the reason.
        again = p.submit("sleep 60", 1, "parsl.t.block-1")
        st = state(p, again)
        assert st.state is JobState.PENDING and "BUCKET_EMPTY" in st.message, st.message
    finally:
        p.close()


def test_workers_exiting_by_themselves_complete_or_fail(
    server: ServerThread, tmp_path: Path
) -> None:
    p = provider(server, "wf", tmp_path, resources_per_block={"cpu": 1})
    try:
        ok = p.submit("true", 1, "parsl.t.block-0")
        bad = p.submit("exit 3", 1, "parsl.t.block-1")
        until(lambda: state(p, ok).terminal and state(p, bad).terminal)
        assert state(p, ok).state is JobState.COMPLETED
        assert state(p, bad).state is JobState.FAILED and state(p, bad).exit_code == 3
        assert not p.ended_by_broker(bad)
        with BrokerClient(server.address, server.tokens["wf"]) as c:
            assert c.list_leases() == []
    finally:
        p.close()


def test_a_bad_token_fails_the_submission(server: ServerThread, tmp_path: Path) -> None:
    from parsl.providers.errors import SubmitException

    p = BursarProvider(broker=server.address, token="bogus", backoff=FAST)
    try:
        with pytest.raises(SubmitException):
            p.submit("sleep 1", 1)
    finally:
        p.close()


def test_the_error_handler_forgives_blocks_the_broker_ended() -> None:
    p = BursarProvider(broker="127.0.0.1:1")
    p.resources["j0"] = MagicMock(ended_by_broker=True)
    p.resources["j1"] = MagicMock(ended_by_broker=False)
    ex = MagicMock(provider=p, blocks_to_job_id={"0": "j0", "1": "j1"})
    missing = JobStatus(JobState.MISSING, "lease L1 preempted by the broker")
    lease_error_handler(ex, {"0": missing})
    ex.set_bad_state_and_fail_all.assert_not_called()
    lease_error_handler(ex, {"0": missing, "1": JobStatus(JobState.FAILED, "exit 1")})
    ex.set_bad_state_and_fail_all.assert_called_once()


def test_the_retry_handler_charges_little_for_a_lost_manager() -> None:
    assert lease_retry_handler(ManagerLost(b"m", "h"), None) == 0.25
    assert lease_retry_handler(ValueError(), None) == 1.0


def test_walltime_and_knobs() -> None:
    p = BursarProvider(
        broker="x",
        resources_per_block={"cpu": 8, "mem_gb": 32},
        nodes_per_block=2,
        walltime="01:02:03",
        max_blocks=3,
        lease_class="opportunistic",
    )
    assert p.duration_s == 3723 and p.cores_per_node == 4 and p.mem_per_node == 16
    assert p.max_blocks == 3 and p.label == "bursar" and "token" not in repr(p)
    with pytest.raises(ValueError):
        BursarProvider(broker="x", resources_per_block={"cpu": 0})
    # An elastic block: units of resources_per_block, checked up front.
    e = BursarProvider(
        broker="x",
        resources_per_block={"cpu": 2, "mem_gb": 4},
        elastic={"max": 3, "work": 60, "deadline": "00:10:00"},
    )
    assert e.elastic is not None and (e.elastic.min, e.elastic.max) == (1, 3)
    intent = e.elastic.intent(e.resources_per_block)
    assert intent.max == {"cpu": 6, "mem_gb": 12} and intent.deadline_s == 600
    for bad, why in [
        ({"max": 3, "work": 60}, "missing"),
        ({"max": 0, "work": 60, "deadline": 5}, "1 <= min <= max"),
        ({"max": 2, "work": -1, "deadline": 5}, "work > 0"),
    ]:
        with pytest.raises(ValueError, match=why):
            BursarProvider(broker="x", elastic=bad)
    with pytest.raises(ValueError, match="nodes_per_block must be 1"):
        BursarProvider(broker="x", nodes_per_block=2, elastic={"max": 2, "work": 60, "deadline": 5})


def test_submit_returns_quickly_when_the_broker_is_unreachable(tmp_path: Path) -> None:
    p = BursarProvider(
        broker="127.0.0.1:1", token="t", backoff=FAST, submit_timeout_s=0.3, retry_timeout_s=1
    )
    try:
        t0 = time.monotonic()
        job = p.submit("sleep 1", 1)
        assert time.monotonic() - t0 < 2
        assert p.status([job])[0].state is JobState.PENDING
        until(lambda: "unreachable" in p.status([job])[0].message, 10, "unreachable")
    finally:
        p.close()
    assert p.status([job])[0].state is JobState.CANCELLED


def test_a_block_the_bucket_can_never_hold_fails_to_submit(
    server: ServerThread, tmp_path: Path
) -> None:
    from parsl.providers.errors import SubmitException

    # 1 core for 10 s needs 10 core-seconds; "poor"'s bucket holds 2.5: OUT_OF_RANGE.
    p = provider(server, "poor", tmp_path, resources_per_block={"cpu": 1}, walltime=10)
    try:
        with pytest.raises(SubmitException, match="OUT_OF_RANGE"):
            p.submit("sleep 60", 1, "parsl.t.block-0")
        assert p.resources == {}
    finally:
        p.close()


def test_a_block_sized_from_supply_signals_takes_what_is_warm(
    server: ServerThread, tmp_path: Path
) -> None:
    seen: list[float] = []

    def size(supply: Supply, wanted: Mapping[str, float]) -> dict[str, float]:
        seen.append(supply.dims["cpu"].available_warm)
        return fit_to_warm(supply, wanted)

    with BrokerClient(server.address, server.tokens["hi"], backoff=FAST) as hi:
        hi.acquire({"cpu": 3}, 30, blocking=False)  # 1 of the node's 4 cores left warm
        p = provider(server, "wf", tmp_path, resources_per_block={"cpu": 4}, size_from_supply=size)
        env_file = tmp_path / "env"
        try:
            job = p.submit(f"env > {env_file}; sleep 60", 1, "parsl.t.block-0")
            until(lambda: state(p, job).state is JobState.RUNNING)
            assert seen == [1.0]
            until(lambda: "PARSL_CORES=1\n" in (env_file.read_text() if env_file.exists() else ""))
        finally:
            p.close()


def test_bad_settings_are_refused_at_construction_with_what_to_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match=r"'HH:MM:SS' \(e.g. '00:10:00'"):
        BursarProvider(broker="127.0.0.1:1", token="t", walltime="10 minutes")
    with pytest.raises(ValueError, match=r"unknown dimension\(s\) 'gpus'; allowed: gpu"):
        BursarProvider(broker="127.0.0.1:1", token="t", resources_per_block={"gpus": 1})
    assert BursarProvider(broker="127.0.0.1:1", token="t", walltime="00:10:00").duration_s == 600
    # The token from the environment, as the CLI, Dask and Ray take it.
    monkeypatch.setenv("BURSAR_TOKEN", "from-env")
    assert BursarProvider(broker="127.0.0.1:1")._token == "from-env"
