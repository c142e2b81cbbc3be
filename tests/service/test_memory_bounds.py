"""What grows with traffic stays within its bound: many keyed Acquires and Releases through
a real in-process service (real gRPC on loopback, the manual clock), and the engine's
idempotency keys and ended leases held at their configured counts and windows."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_support import LIFECYCLE, START, config, run, serve

from bursar.broker import ended as ended_module
from bursar.broker import keys as keys_module
from bursar.broker.clock import ManualClock
from bursar.broker.config import parse_config
from bursar.broker.engine import Engine
from bursar.broker.errors import ConfigError
from bursar.protos.bursar.v1 import broker_pb2 as pb

KEYS_KEPT = 200
ENDED_KEPT = 50
WINDOW_S = 600.0


def _bounded(extra: str = "") -> str:
    return LIFECYCLE.replace(
        "[policy]\n",
        "[policy]\n"
        f"idempotency_keys_kept = {KEYS_KEPT}\n"
        f"ended_leases_kept = {ENDED_KEPT}\n"
        f"idempotency_window_s = {WINDOW_S}\n" + extra,
        1,
    )


def test_keys_and_ended_leases_stay_within_their_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ended_module, "CHUNK", 10)  # so that 50 kept is a few chunks
    clock = ManualClock(START)
    calls = 3 * KEYS_KEPT

    async def scenario() -> None:
        async with serve(tmp_path, config(_bounded()), clock=clock) as c:
            eng: Engine = c.core.runtime.engine
            keys, ended = eng.idempotency, eng.ended
            first = await c.acquire("sci", 1, idempotency_key="k0")
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=first.lease.lease_id), metadata=c.as_("sci")
            )
            most_keys = most_ended = 0
            for i in range(1, calls):
                got = await c.acquire("sci", 1, idempotency_key=f"k{i}")
                await c.broker.Release(
                    pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=c.as_("sci")
                )
                clock.advance(0.25)
                most_keys = max(most_keys, len(keys))
                most_ended = max(most_ended, len(ended))
            # Between the bound and one chunk more, never above; and the bound reached.
            assert KEYS_KEPT <= most_keys < KEYS_KEPT + keys_module.CHUNK
            assert ENDED_KEPT <= most_ended < ENDED_KEPT + ended_module.CHUNK
            # The newest keys answer a retry with the first call's lease, no new entry.
            n = c.journal_len()
            again = await c.acquire("sci", 1, idempotency_key=f"k{calls - 1}")
            assert again.lease.lease_id == got.lease.lease_id
            assert c.journal_len() == n
            # The first key, past the bound, is a new request.
            anew = await c.acquire("sci", 1, idempotency_key="k0")
            assert anew.lease.lease_id != first.lease.lease_id
            # Past the window every frozen chunk goes; what is left is the open chunk.
            clock.advance(WINDOW_S + 1)
            await c.acquire("sci", 1, idempotency_key="late")
            assert len(keys) < keys_module.CHUNK
            assert keys.get("sci", f"k{calls - 1}") is None

    run(scenario(), timeout_s=120)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("idempotency_keys_kept = 0", "idempotency_keys_kept"),
        ("idempotency_keys_kept = 1.5", "idempotency_keys_kept"),
        ("ended_leases_kept = -1", "ended_leases_kept"),
        ("idempotency_window_s = 0", "idempotency_window_s"),
        ("idempotency_window_s = nan", "idempotency_window_s"),
    ],
)
def test_a_bad_bound_names_its_key(line: str, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(
            LIFECYCLE.replace("[policy]\n", f"[policy]\n{line}\n", 1), "toml", source="x.toml"
        )
    assert f"policy.{key}" in str(e.value) and "x.toml" in str(e.value)
