"""A slow disk must not stall the service: the journal's WAL checkpoints (its only fsyncs
under ``synchronous=NORMAL``) run on a worker thread, never inside a commit on the event
loop. Here every fsync of the real `bursar serve` process takes 300 ms (a shim preloaded
into it), and no call may wait for one."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from conftest import missing_system_part
from server import Server, md, pool_toml

from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

FSYNC_DELAY_S = 0.3

SHIM = f"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>

static void slow(void) {{
    struct timespec t = {{0, {int(FSYNC_DELAY_S * 1e9)}}};
    nanosleep(&t, 0);
}}
int fsync(int fd) {{
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow();
    return real(fd);
}}
int fdatasync(int fd) {{
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow();
    return real(fd);
}}
"""


@pytest.fixture(scope="module")
def slow_fsync(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        # scripts/system-deps.sh installs gcc; in CI a missing compiler is a failure.
        missing_system_part(
            "no C compiler for the slow-fsync shim (scripts/system-deps.sh installs gcc)"
        )
    d = tmp_path_factory.mktemp("shim")
    (d / "slowsync.c").write_text(SHIM)
    lib = d / "slowsync.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(lib), str(d / "slowsync.c"), "-ldl"],
        check=True,
        capture_output=True,
    )
    return lib


def test_no_call_waits_for_a_checkpoint_on_a_slow_disk(tmp_path: Path, slow_fsync: Path) -> None:
    cfg = tmp_path / "pool.toml"
    cfg.write_text(pool_toml(nodes=2, campaigns={"sci": 16}))
    state = tmp_path / "state"
    server = Server(
        state,
        *("--config", str(cfg), "--rate-limit", "100000", "--rate-burst", "100000"),
        env={"LD_PRELOAD": str(slow_fsync)},
    )
    journal = state / "journal.sqlite"
    try:
        token = server.tokens()["sci"]

        async def churn() -> list[float]:
            async with grpc.aio.insecure_channel(server.address) as ch:
                stub = pbg.BrokerStub(ch)
                lat: list[float] = []
                # Each decision is a commit of at least one WAL page: well past the 1000
                # pages at which SQLite would checkpoint inside a commit.
                for _ in range(800):
                    t0 = time.perf_counter()
                    got = await stub.Acquire(
                        pb.AcquireRequest(size={"gpu": 1}, duration_s=60), metadata=md(token)
                    )
                    t1 = time.perf_counter()
                    await stub.Release(
                        pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=md(token)
                    )
                    lat += [t1 - t0, time.perf_counter() - t1]
                return lat

        size_before = journal.stat().st_size
        lat = asyncio.run(churn())
        # The checkpoints did run (on their thread): the WAL's pages reached the database.
        deadline = time.monotonic() + 10
        while journal.stat().st_size <= size_before and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        server.close()
    assert journal.stat().st_size > size_before
    slow = sorted(lat)[-3:]
    # A checkpoint on the loop would hold a call for two fsyncs (WAL, then database).
    assert slow[-1] < FSYNC_DELAY_S, f"slowest calls {slow}"
