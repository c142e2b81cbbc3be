"""The sync facade (BrokerClient, AdminClient, SyncLeaseHandle) from plain threads,
against a broker running on its own loop in another thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from client_support import ServerThread, server_thread, until
from elastic_support import cpu_intent, elastic_config
from service_support import START

from bursar.broker.clock import ManualClock
from bursar.providers.client import (
    AdminClient,
    Backoff,
    BrokerClient,
    LeaseEvent,
    LeaseEventKind,
    LeaseState,
    NotFound,
    Refused,
)

FAST = Backoff(initial_s=0.05, max_s=0.3)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path) as s:
        yield s


def test_one_sync_client_serves_many_plain_threads(server: ServerThread) -> None:
    with BrokerClient(server.address, server.tokens["sci"], backoff=FAST, rng=3) as client:

        def work(i: int) -> list[str]:
            ids = []
            for _ in range(5):
                lease = client.acquire({"gpu": 2}, 30, blocking=False, labels={"t": str(i)})
                assert lease.state is LeaseState.ACTIVE and lease.labels == {"t": str(i)}
                ids.append(lease.id)
                assert client.release(lease.id).state is LeaseState.RELEASED
            return ids

        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(work, range(6)))
        ids = [x for r in results for x in r]
        assert len(set(ids)) == 30
        assert client.list_leases() == []
        assert client.status().caller == "campaign:sci"

        held = client.acquire({"gpu": 16}, 30, blocking=False)
        with pytest.raises(Refused) as refused:
            client.acquire({"gpu": 16}, 30, blocking=False)
        # 16 + 16 pass sci's burst (24), but that is the whole pool: the pool is full.
        assert refused.value.reason == "POOL_FULL"
        client.release(held.id)
        with pytest.raises(NotFound):
            client.get_lease("L9999")
    with pytest.raises(RuntimeError, match="closed"):
        client.status()


def test_sync_held_lease_renews_and_sees_a_preemption_from_a_worker_thread(
    tmp_path: Path,
) -> None:
    # One manual clock for the broker and the clients, moved by this (plain) thread; the
    # sleepers it wakes are on the broker's and the clients' own loop threads.
    clock = ManualClock(START)
    with (
        server_thread(tmp_path, clock=clock) as server,
        BrokerClient(server.address, server.tokens["backfill"], backoff=FAST, clock=clock) as back,
        BrokerClient(server.address, server.tokens["sci"], backoff=FAST, clock=clock) as sci,
    ):
        called: list[tuple[LeaseEvent, str, str]] = []

        def drain(ev: LeaseEvent) -> None:
            # Runs in a worker thread: it may block, and call the client.
            called.append((ev, threading.current_thread().name, back.status().caller))

        with back.held_lease({"gpu": 16}, 1.0, renew_margin_s=0.5, on_preempt=drain) as h:
            assert h.active.is_set() and h.lease.preemptible
            until(
                lambda: START + 0.5 in clock.deadlines(), what="renewal scheduled", interval_s=0.005
            )
            clock.set(START + 0.5)
            until(lambda: h.renewals == 1, what="renewed", interval_s=0.005)
            assert h.lease.expires_at == START + 1.5 and not h.ended.is_set()
            claim = sci.acquire({"gpu": 8}, 30, blocking=False)
            assert h.preempted.wait(5)
            until(lambda: called, what="on_preempt ran", interval_s=0.005)  # in its worker thread
            # The pool's grace period (0.6 s) from the claim, on the broker's clock.
            assert claim.starts_at == START + 0.5 + 0.6
            assert h.preempt_deadline == claim.starts_at
            assert not h.ended.is_set()
            until(lambda: claim.starts_at in clock.deadlines(), what="revocation", interval_s=0.005)
            clock.set(claim.starts_at)
            assert h.ended.wait(5)
            assert h.end_event is not None and h.end_event.kind is LeaseEventKind.REVOKED
        assert h.lease.state is LeaseState.REVOKED and h.error is None
        assert len(called) == 1
        ev, thread_name, caller = called[0]
        assert ev.kind is LeaseEventKind.PREEMPT_WARNING and caller == "campaign:backfill"
        assert not thread_name.startswith("bursar-client")


def test_sync_held_lease_releases_on_exception_and_sync_watch_iterates(
    server: ServerThread,
) -> None:
    with BrokerClient(server.address, server.tokens["sci"], backoff=FAST) as client:
        handle = client.held_lease({"gpu": 8}, 30)
        with pytest.raises(KeyError), handle:
            raise KeyError("boom")
        assert handle.lease.state is LeaseState.RELEASED
        assert client.get_lease(handle.id).state is LeaseState.RELEASED

        lease = client.acquire({"gpu": 8}, 30, blocking=False)
        events = client.watch(lease.id)
        first = next(events)
        assert first.snapshot and first.kind is LeaseEventKind.ACTIVATED
        releaser = threading.Timer(0.1, client.release, args=(lease.id,))
        releaser.start()
        rest = [ev.kind for ev in events]  # ends with the lease
        releaser.join()
        assert rest == [LeaseEventKind.RELEASED]

        with contextlib.closing(client.watch_supply(min_interval_s=0.05)) as supplies:
            assert next(supplies).dims["gpu"].capacity == 24


def test_sync_admin_client_and_misuse_from_the_loop_thread(server: ServerThread) -> None:
    with AdminClient(server.address, server.admin_token) as admin:
        assert [c.name for c in admin.list_campaigns()] == ["backfill", "other", "sci"]
        assert admin.get_campaign("sci").spec.envelopes["gpu"].burst == 24

    with BrokerClient(server.address, server.tokens["sci"]) as client:
        caught: list[BaseException] = []
        done = threading.Event()

        def on_loop() -> None:
            try:
                client.status()
            except RuntimeError as exc:
                caught.append(exc)
            done.set()

        client._loop.loop.call_soon_threadsafe(on_loop)
        assert done.wait(5)
        assert caught and "deadlock" in str(caught[0])


def test_a_sync_held_elastic_lease_hears_its_resizes(tmp_path: Path) -> None:
    with (
        server_thread(tmp_path / "el", cfg=elastic_config()) as srv,
        BrokerClient(srv.address, srv.tokens["el"], backoff=FAST) as el,
        BrokerClient(srv.address, srv.tokens["fixed"], backoff=FAST) as fixed,
    ):
        with el.held_lease({}, 60, intent=cpu_intent(1, 4)) as h:
            # Granted at one core and grown at once to the pool's four.
            assert h.lease.size["cpu"] == 4.0
            until(lambda: h.resizes >= 1, 10, "the growth's RESIZED")
            got = fixed.acquire({"cpu": 2}, 30, timeout=20)  # answered after the shrink
            until(lambda: h.lease.size["cpu"] == 2.0, 10, "the shrink's RESIZED")
            assert h.warnings == 1 and h.resize_warning is not None
            assert dict(h.resize_warning.resize_to) == {"cpu": 2.0}
            assert h.resize_warning.deadline == pytest.approx(time.time(), abs=5)
            assert h.resizes >= 2
            fixed.release(got.id)
        assert h.lease.state is LeaseState.RELEASED
