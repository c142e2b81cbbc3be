"""`bursar serve` as a real process: SIGKILL and restart with every lease intact, SIGTERM
finishing in-flight calls, and a clean journal audit afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from click.testing import CliRunner
from server_support import Server
from service_support import LIFECYCLE, details, fails, md, next_event, run

from bursar.cli.main import main
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg
from bursar.testing import apoll_until


def _leases(resp: pb.ListLeasesResponse) -> dict[str, tuple[int, float, tuple[str, ...]]]:
    return {x.lease_id: (x.state, x.expires_at, tuple(x.nodes)) for x in resp.leases}


async def _until_pending(stub: pbg.BrokerStub, admin: str, n: int) -> None:
    """Poll the server's status until ``n`` requests are queued."""

    async def pending() -> int:
        return (await stub.GetStatus(pb.GetStatusRequest(), metadata=md(admin))).pending

    await apoll_until(pending, 10, f"{n} pending", ok=lambda got: got == n)


def test_sigkill_then_restart_keeps_every_lease_and_the_journal_audits_clean(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "pool.toml"
    # Boot slower than the rest of the test takes before the kill: a node is still booting
    # when the server dies, and the restarted server must finish that boot.
    cfg.write_text(LIFECYCLE.replace("boot_latency_s = 0.6", "boot_latency_s = 2.5"))
    state = tmp_path / "state"

    first = Server(state, "--config", str(cfg))
    try:
        tokens, admin = first.tokens(), first.admin()

        async def before_kill() -> dict[str, tuple[int, float, tuple[str, ...]]]:
            async with grpc.aio.insecure_channel(first.address) as ch:
                stub = pbg.BrokerStub(ch)
                for who, gpus in (("sci", 8), ("other", 8), ("sci", 8)):
                    await stub.Acquire(
                        pb.AcquireRequest(size={"gpu": gpus}, duration_s=120),
                        metadata=md(tokens[who]),
                    )
                listed = await stub.ListLeases(pb.ListLeasesRequest(), metadata=md(admin))
                # A blocking request left queued when the server dies.
                queued = stub.Acquire(
                    pb.AcquireRequest(size={"gpu": 8}, duration_s=120, timeout_s=30),
                    metadata=md(tokens["other"]),
                )
                task = asyncio.ensure_future(queued)
                await _until_pending(stub, admin, 1)
                assert not task.done()
                task.cancel()
                return _leases(listed)

        # The cold-path lease (the third) is still STARTING: its node is booting.
        before = run(before_kill())
        assert sorted(s for s, _, _ in before.values()) == [
            pb.LEASE_STATE_STARTING,
            pb.LEASE_STATE_ACTIVE,
            pb.LEASE_STATE_ACTIVE,
        ]
        assert first.kill(signal.SIGKILL) == -signal.SIGKILL
    finally:
        first.close()

    second = Server(state)  # no --config: the journal holds the pool and policy
    try:
        assert "issued tokens" not in "".join(second.lines)

        async def after_restart() -> None:
            async with grpc.aio.insecure_channel(second.address) as ch:
                stub = pbg.BrokerStub(ch)
                listed = await stub.ListLeases(pb.ListLeasesRequest(), metadata=md(admin))
                after = _leases(listed)
                assert set(after) == set(before)
                for lid, (state_, expires, nodes) in before.items():
                    assert after[lid][1] == expires
                    if state_ == pb.LEASE_STATE_ACTIVE:
                        assert after[lid] == (state_, expires, nodes)
                starting = next(lid for lid, v in before.items() if v[0] == pb.LEASE_STATE_STARTING)
                watch = stub.Watch(
                    pb.WatchRequest(lease_ids=[starting]), metadata=md(tokens["sci"])
                )
                snap = await next_event(watch)
                assert snap.snapshot and snap.kind == pb.LEASE_EVENT_KIND_GRANTED
                activated = await next_event(watch)  # the restarted server finishes the boot
                assert activated.kind == pb.LEASE_EVENT_KIND_ACTIVATED
                assert list(activated.lease.nodes) == ["c000"]
                watch.cancel()
                # The old tokens still work; leases can be renewed and released.
                lid = next(iter(sorted(before)))
                await stub.Renew(
                    pb.RenewRequest(lease_id=lid, duration_s=300), metadata=md(tokens["sci"])
                )
                rel = await stub.Release(
                    pb.ReleaseRequest(lease_id=lid), metadata=md(tokens["sci"])
                )
                assert rel.lease.state == pb.LEASE_STATE_RELEASED
                # The request queued when the first server died was withdrawn.
                st = await stub.GetStatus(pb.GetStatusRequest(), metadata=md(admin))
                assert st.pending == 0 and st.leases == 2

                # SIGTERM with calls in flight: a blocking Acquire and a Watch stream.
                await stub.Acquire(  # the last free GPUs
                    pb.AcquireRequest(size={"gpu": 8}, duration_s=120), metadata=md(tokens["other"])
                )
                waiting = asyncio.ensure_future(
                    stub.Acquire(
                        pb.AcquireRequest(size={"gpu": 8}, duration_s=60, timeout_s=30),
                        metadata=md(tokens["other"]),
                    )
                )
                stream = stub.Watch(pb.WatchRequest(), metadata=md(tokens["sci"]))
                await stream.initial_metadata()
                await _until_pending(stub, admin, 1)  # the Acquire is queued
                second.proc.send_signal(signal.SIGTERM)
                d = await fails(waiting)
                assert d.code == grpc.StatusCode.UNAVAILABLE and d.reason == "SHUTTING_DOWN"
                assert d.retry_after_s == 1.0
                try:
                    while await stream.read() is not grpc.aio.EOF:
                        pass
                except grpc.aio.AioRpcError as err:
                    assert details(err).reason == "SHUTTING_DOWN"
                # Both ended by the shutdown (SHUTTING_DOWN), not by the Acquire's 30 s wait.

        run(after_restart())
        assert second.proc.wait(timeout=15) == 0
        assert second.wait_for("stopped; journal closed")
    finally:
        second.close()

    result = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    assert "0 mismatches" in result.output


def test_serve_refuses_a_changed_policy_with_the_command_that_applies_it(tmp_path: Path) -> None:
    cfg = tmp_path / "pool.toml"
    cfg.write_text(LIFECYCLE)
    state = tmp_path / "state"
    server = Server(state, "--config", str(cfg))
    try:
        assert server.kill(signal.SIGTERM) == 0
    finally:
        server.close()
    other = tmp_path / "other.toml"
    other.write_text(LIFECYCLE.replace("grace_s = 0.6", "grace_s = 5"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bursar.broker.service",
            "--state-dir",
            str(state),
            "--config",
            str(other),
            "--port",
            "0",
            "--no-metrics",
            "--no-dashboard",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert proc.returncode == 2
    # The refusal names the key and gives the command that applies the change.
    assert "grace_s: in force 0.6, given 5.0" in proc.stderr
    command = f"bursar policy apply --state-dir {state} --config {other}"
    assert command in proc.stderr
    applied = CliRunner().invoke(main, command.split()[1:])
    assert applied.exit_code == 0, applied.output
    assert "grace_s  0.6 -> 5.0" in applied.output and "applied at journal entry" in applied.output
    # Served again with the new config: it starts, with the journal's state.
    again = Server(state, "--config", str(other))
    try:
        assert again.kill(signal.SIGTERM) == 0
    finally:
        again.close()
    result = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output


def test_watch_from_seq_across_a_sigkill_has_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    """A stream that saw only its first event before the broker was killed resumes, on the
    restarted broker, with exactly the events it missed, then follows live; a stream from
    the start replays the campaign's whole history in the same order."""
    cfg = tmp_path / "pool.toml"
    cfg.write_text(LIFECYCLE)
    state = tmp_path / "state"

    def position(ev: pb.LeaseEvent) -> tuple[int, int]:
        return ev.seq, ev.index

    def brief(ev: pb.LeaseEvent) -> tuple[int, int, int, str]:
        return ev.seq, ev.index, ev.kind, ev.lease.lease_id

    first = Server(state, "--config", str(cfg))
    try:
        tokens = first.tokens()
        sci = md(tokens["sci"])

        async def before_kill() -> tuple[pb.LeaseEvent, list[str]]:
            async with grpc.aio.insecure_channel(first.address) as ch:
                stub = pbg.BrokerStub(ch)
                stream = stub.Watch(pb.WatchRequest(), metadata=sci)
                await stream.initial_metadata()
                one = await stub.Acquire(
                    pb.AcquireRequest(size={"gpu": 4}, duration_s=600), metadata=sci
                )
                seen = await next_event(stream)
                # More happens after the one event this stream delivered.
                two = await stub.Acquire(
                    pb.AcquireRequest(size={"gpu": 4}, duration_s=600), metadata=sci
                )
                await stub.Renew(
                    pb.RenewRequest(lease_id=one.lease.lease_id, duration_s=900), metadata=sci
                )
                await stub.Release(pb.ReleaseRequest(lease_id=two.lease.lease_id), metadata=sci)
                return seen, [one.lease.lease_id, two.lease.lease_id]

        seen, (l1, l2) = run(before_kill())
        assert (seen.kind, seen.lease.lease_id) == (pb.LEASE_EVENT_KIND_GRANTED, l1)
        assert first.kill(signal.SIGKILL) == -signal.SIGKILL
    finally:
        first.close()

    second = Server(state)
    try:

        async def after_restart() -> tuple[list[pb.LeaseEvent], list[pb.LeaseEvent]]:
            async with grpc.aio.insecure_channel(second.address) as ch:
                stub = pbg.BrokerStub(ch)
                resumed = stub.Watch(
                    pb.WatchRequest(from_seq=seen.seq, from_index=seen.index + 1), metadata=sci
                )
                missed = [await next_event(resumed) for _ in range(3)]
                three = await stub.Acquire(
                    pb.AcquireRequest(size={"gpu": 2}, duration_s=60), metadata=sci
                )
                live = await next_event(resumed)
                assert live.lease.lease_id == three.lease.lease_id and not live.snapshot
                resumed.cancel()
                whole = stub.Watch(pb.WatchRequest(from_seq=1), metadata=sci)
                history = [await next_event(whole) for _ in range(5)]
                whole.cancel()
                return [*missed, live], history

        after, history = run(after_restart())
    finally:
        second.close()
    assert [(e.kind, e.lease.lease_id) for e in after[:3]] == [
        (pb.LEASE_EVENT_KIND_GRANTED, l2),
        (pb.LEASE_EVENT_KIND_RENEWED, l1),
        (pb.LEASE_EVENT_KIND_RELEASED, l2),
    ]
    positions = [position(seen), *map(position, after)]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # What the two streams delivered together is the campaign's history, once each.
    assert [brief(seen), *map(brief, after)] == list(map(brief, history))


def test_a_start_on_a_taken_port_names_it_and_leaves_no_state(tmp_path: Path) -> None:
    import socket

    cfg = tmp_path / "pool.toml"
    cfg.write_text(LIFECYCLE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, flag in (
            (["--port", str(port), "--no-metrics", "--no-dashboard"], "--port"),
            (["--port", "0", "--metrics-port", str(port), "--no-dashboard"], "--metrics-port"),
            (["--port", "0", "--no-metrics", "--dashboard-port", str(port)], "--dashboard-port"),
        ):
            state = tmp_path / f"state{flag}"
            proc = subprocess.run(
                [
                    sys.executable,
                    *("-m", "bursar.broker.service", "--state-dir", str(state)),
                    *("--config", str(cfg), *args),
                ],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ},
            )
            assert proc.returncode != 0
            assert str(port) in proc.stderr and flag in proc.stderr, proc.stderr
            assert len(proc.stderr.splitlines()) <= 3, proc.stderr  # no traceback
            assert not state.exists() or not any(state.iterdir())
