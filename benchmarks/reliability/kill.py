"""kill -9 under load: the broker is SIGKILLed at random moments (seeded) while agents
acquire (blocking and not, some queued), renew and release, and restarted on the same
state directory each time; agents retry on UNAVAILABLE against the restarted server with
the same idempotency key.

Checked, from what the agents were told and from the journal (ListDecisions, every
decision, read from the last server):

* lost: an acknowledged grant the journal does not hold, or that the last server does not
  know (GetLease) as live or as ended by a journaled decision; an acknowledged release the
  journal does not hold;
* duplicated: two leases acknowledged for one idempotency key, one lease acknowledged for
  two keys, or two GRANT decisions for one request;
* over-commit: at any journal entry, the live leases' GPUs (granted, not yet ended) above
  the pool's capacity;
* ghosts: a request queued when the server was killed that the restarted server granted
  instead of withdrawing; and right after each restart (before any agent is let back in)
  GetStatus must say nothing is pending;
* the final ``bursar journal audit``: 0 mismatches.

Besides the agents above (which pause between calls), burst agents loop Acquire+Release
back to back, so that requests overlap and the server commits their journal entries in
batches: each server's entries per commit is read from its /metrics just before the kill,
and at least one commit must have held several entries (the kills then land on open
batches, whose callers must not have been answered).

Recovery time is from the kill to the restarted server's first answered call (GetStatus);
the process's own start-up to "listening on" (``Server.ready_s``) is reported beside it.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from click.testing import CliRunner
from common import Mode, Result, quantiles
from server import Server, md, pool_toml

from bursar.cli.main import main as cli
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

SIZES = {
    # kills, agents, nodes (8 GPUs each), seconds between kills (uniform range)
    "short": (3, 8, 3, (2.0, 4.0)),
    "long": (20, 32, 8, (3.0, 9.0)),
}
BURST = {"short": 8, "long": 16}
"""Agents that loop a small non-blocking Acquire and its Release back to back, no pauses:
the concurrent load under which the service commits several requests' journal entries
together (its commit batches), so that the kills also land while a batch is open."""
SEED = 20261201
CAMPAIGNS = ("a", "b", "c", "d")
END_KINDS = {pb.DECISION_KIND_RELEASE, pb.DECISION_KIND_EXPIRE, pb.DECISION_KIND_REVOKE}


class Target:
    """The server the agents talk to now; ``up`` is clear while it is down."""

    def __init__(self) -> None:
        self.stub: pbg.BrokerStub | None = None
        self.channel: grpc.aio.Channel | None = None
        self.up = asyncio.Event()
        self.generation = 0

    def point_at(self, channel: grpc.aio.Channel) -> grpc.aio.Channel | None:
        old, self.channel = self.channel, channel
        self.stub = pbg.BrokerStub(channel)
        self.generation += 1
        self.up.set()
        return old


@dataclass
class Seen:
    """What the agents were told."""

    acked: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Idempotency key -> lease ids acknowledged for it."""
    released: set[str] = field(default_factory=set)
    """Leases a Release acknowledged as released by this call (not already ended)."""
    refused: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    calls: int = 0
    answered_after_retry: Counter[str] = field(default_factory=Counter)
    """Calls answered (OK) by a restarted server after failing with UNAVAILABLE."""


class Agent:
    def __init__(
        self,
        n: int,
        target: Target,
        token: str,
        seen: Seen,
        stop: asyncio.Event,
        burst: bool = False,
    ) -> None:
        self.n = n
        self.target = target
        self.md = md(token)
        self.seen = seen
        self.stop = stop
        self.burst = burst
        self.rng = random.Random(SEED + n)

    async def call(self, name: str, req: object) -> object:
        """One call, retried (the same request, so the same idempotency key) while the
        server is unreachable."""
        retried = False
        while True:
            await self.target.up.wait()
            gen = self.target.generation
            try:
                self.seen.calls += 1
                out = await getattr(self.target.stub, name)(req, metadata=self.md, timeout=30)
                if retried:
                    self.seen.answered_after_retry[name] += 1
                return out
            except grpc.aio.AioRpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                # UNAVAILABLE: the server died under the call (or had not come back yet);
                # CANCELLED: the harness closed the dead server's channel under it.
                self.seen.retries += 1
                retried = True
                if self.target.generation == gen:
                    await asyncio.sleep(0.02)

    async def burst_loop(self) -> None:
        """Acquire one GPU (non-blocking, keyed) and release it at once, over and over."""
        i = 0
        while not self.stop.is_set():
            i += 1
            key = f"burst{self.n}-{i}"
            req = pb.AcquireRequest(size={"gpu": 1, "cpu": 1}, duration_s=5.0, idempotency_key=key)
            try:
                got = await self.call("Acquire", req)
            except grpc.aio.AioRpcError as err:
                self._refusal("Acquire", err)
                await asyncio.sleep(0.01)
                continue
            lease_id = got.lease.lease_id  # type: ignore[attr-defined]
            self.seen.acked[key].add(lease_id)
            rel = await self.call("Release", pb.ReleaseRequest(lease_id=lease_id))
            if not rel.already_ended:  # type: ignore[attr-defined]
                self.seen.released.add(lease_id)

    async def loop(self) -> None:
        if self.burst:
            await self.burst_loop()
            return
        rng, i = self.rng, 0
        while not self.stop.is_set():
            i += 1
            key = f"agent{self.n}-{i}"
            blocking = rng.random() < 0.4
            gpus = rng.choice((2, 4, 4, 8))
            req = pb.AcquireRequest(
                size={"gpu": gpus, "cpu": gpus * rng.choice((2, 4, 8))},
                duration_s=rng.uniform(2, 6),
                timeout_s=rng.uniform(0.5, 3) if blocking else 0.0,
                idempotency_key=key,
            )
            try:
                got = await self.call("Acquire", req)
            except grpc.aio.AioRpcError as err:
                self._refusal("Acquire", err)
                await asyncio.sleep(rng.uniform(0.05, 0.3))
                continue
            lease_id = got.lease.lease_id  # type: ignore[attr-defined]
            self.seen.acked[key].add(lease_id)
            alive = True
            for _ in range(rng.randint(0, 2)):
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                try:
                    await self.call(
                        "Renew", pb.RenewRequest(lease_id=lease_id, duration_s=rng.uniform(2, 6))
                    )
                except grpc.aio.AioRpcError as err:
                    self._refusal("Renew", err)  # ended meanwhile (expired while down)
                    alive = False
                    break
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            if alive and rng.random() < 0.85:
                rel = await self.call("Release", pb.ReleaseRequest(lease_id=lease_id))
                if not rel.already_ended:  # type: ignore[attr-defined]
                    self.seen.released.add(lease_id)

    def _refusal(self, name: str, err: grpc.aio.AioRpcError) -> None:
        code = err.code()
        expected = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION}
        (self.seen.refused if code in expected else self.seen.failed)[f"{name} {code.name}"] += 1


def last_decision_seq(state: Path) -> int:
    """The journal's last decision's entry, read with ``bursar journal tail`` while no
    server runs."""
    out = CliRunner().invoke(
        cli, ["journal", "tail", "-n", "1", "--json", "--state-dir", str(state)]
    )
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    return json.loads(lines[-1])["seq"] if lines else 0


async def all_decisions(stub: pbg.BrokerStub, admin: str) -> list[pb.DecisionRecord]:
    out: list[pb.DecisionRecord] = []
    start = 1
    while True:
        page = await stub.ListDecisions(
            pb.ListDecisionsRequest(start_seq=start, limit=1000), metadata=md(admin)
        )
        out.extend(page.decisions)
        if not page.next_seq:
            return out
        start = page.next_seq


def analyse(
    decisions: list[pb.DecisionRecord], kill_seqs: list[int], capacity: dict[str, float]
) -> dict[str, object]:
    """Grants per request, ended leases, over-commits and ghosts, from the journal alone."""
    grants: Counter[str] = Counter()
    ends: set[str] = set()
    held: dict[str, dict[str, float]] = {}
    over: list[tuple[int, str, float]] = []
    peak = dict.fromkeys(capacity, 0.0)
    pending: set[str] = set()
    kills = sorted(kill_seqs)
    k = 0
    after_kill: dict[str, int] = {}
    """Request queued at a kill -> the kind of its next decision (0: none yet)."""

    def crossed() -> None:
        for r in pending:
            after_kill.setdefault(r, 0)

    for i, d in enumerate(decisions):
        while k < len(kills) and d.seq > kills[k]:
            crossed()
            k += 1
        lid = d.lease_id
        if after_kill.get(lid, -1) == 0 and d.kind != pb.DECISION_KIND_QUEUE:
            after_kill[lid] = d.kind
        if d.kind == pb.DECISION_KIND_QUEUE:
            pending.add(lid)
        elif d.kind in (
            pb.DECISION_KIND_GRANT,
            pb.DECISION_KIND_CANCELLED,
            pb.DECISION_KIND_REJECT,
        ):
            pending.discard(lid)
        if d.kind == pb.DECISION_KIND_GRANT:
            grants[lid] += 1
            held[lid] = json.loads(d.json)["size"]
        elif d.kind in END_KINDS:
            ends.add(lid)
            held.pop(lid, None)
        if i + 1 == len(decisions) or decisions[i + 1].seq != d.seq:  # the entry is complete
            for dim, cap in capacity.items():
                total = sum(size.get(dim, 0.0) for size in held.values())
                peak[dim] = max(peak[dim], total)
                if total > cap + 1e-9:
                    over.append((d.seq, dim, total))
    if k < len(kills):
        crossed()
    kinds = Counter(after_kill.values())
    return {
        "grants": grants,
        "ends": ends,
        "over_commits": over,
        "peak_held": peak,
        "queued_at_kills": len(after_kill),
        "withdrawn_at_restart": kinds[pb.DECISION_KIND_CANCELLED],
        "ghosts": sorted(r for r, kind in after_kill.items() if kind == pb.DECISION_KIND_GRANT),
        "unresolved": sorted(r for r, kind in after_kill.items() if kind == 0),
    }


def scrape_commits(server: Server) -> tuple[float, float]:
    """(commits, entries committed) so far by ``server``, from its /metrics."""
    url = server.wait_for("metrics on").split("metrics on ", 1)[1].split()[0]
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    values = {}
    for name in ("bursar_journal_commits_total", "bursar_journal_committed_entries_total"):
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        values[name] = float(found.group(1)) if found else 0.0
    return values["bursar_journal_commits_total"], values["bursar_journal_committed_entries_total"]


def audit(state: Path) -> tuple[int, str]:
    out = CliRunner().invoke(cli, ["journal", "audit", "--state-dir", str(state)])
    return out.exit_code, out.output


def run(mode: Mode, work_dir: Path) -> Result:
    kills, agents_n, nodes, gap = SIZES[mode]
    res = Result("kill")
    gpus = nodes * 8.0
    capacity = {"gpu": gpus, "cpu": gpus * 8}
    cfg = work_dir / "pool.toml"
    cfg.write_text(pool_toml(nodes=nodes, campaigns={c: gpus for c in CAMPAIGNS}, cpu=True))
    state = work_dir / "state"
    rng = random.Random(SEED)
    args = (
        *("--rate-limit", "100000", "--rate-burst", "100000", "--grace", "1"),
        *("--metrics-port", "0"),
    )
    bursts = BURST[mode]
    batches: list[tuple[float, float]] = []
    """(commits, entries) of each server, read just before it was killed (or stopped)."""
    server = Server(state, "--config", str(cfg), *args)
    tokens, admin = server.tokens(), server.admin()
    seen = Seen()
    kill_seqs: list[int] = []
    recovery: list[float] = []
    ready: list[float] = []
    pending_after_restart: list[int] = []
    snapshot_over: list[str] = []

    async def main() -> dict[str, object]:
        nonlocal server
        target = Target()
        target.point_at(grpc.aio.insecure_channel(server.address))
        stop = asyncio.Event()
        agents = [
            Agent(i, target, tokens[CAMPAIGNS[i % len(CAMPAIGNS)]], seen, stop)
            for i in range(agents_n)
        ] + [
            Agent(agents_n + i, target, tokens[CAMPAIGNS[i % len(CAMPAIGNS)]], seen, stop, True)
            for i in range(bursts)
        ]
        tasks = [asyncio.ensure_future(a.loop()) for a in agents]
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(*gap))
            # Read while the agents go on: the kill follows within milliseconds, most likely
            # with a batch open (its callers not answered yet).
            batches.append(await asyncio.to_thread(scrape_commits, server))
            target.up.clear()
            t_kill = time.perf_counter()
            server.kill(signal.SIGKILL)
            server.close()
            kill_seqs.append(last_decision_seq(state))
            server = Server(state, *args)  # no --config: the journal holds pool and policy
            ready.append(server.ready_s)
            channel = grpc.aio.insecure_channel(server.address)
            stub = pbg.BrokerStub(channel)
            while True:
                try:
                    status = await stub.GetStatus(pb.GetStatusRequest(), metadata=md(admin))
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.005)
            recovery.append(time.perf_counter() - t_kill)
            # No agent is back yet: whatever was queued at the kill must have been withdrawn.
            pending_after_restart.append(status.pending)
            live = await stub.ListLeases(pb.ListLeasesRequest(), metadata=md(admin))
            for dim, cap in capacity.items():
                total = sum(ls.size.get(dim, 0.0) for ls in live.leases)
                if total > cap:
                    snapshot_over.append(f"restart {len(recovery)}: {total} {dim} live")
            old = target.point_at(channel)
            if old is not None:
                await old.close()
        await asyncio.sleep(rng.uniform(*gap))
        stop.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        batches.append(await asyncio.to_thread(scrape_commits, server))
        crashed = [repr(r) for r in results if isinstance(r, BaseException)]
        assert target.stub is not None
        # The leases left held run out (at most their last duration, 6 s): then every
        # acknowledged lease has ended, and the journal read below holds every end.
        deadline = time.monotonic() + 30
        while (
            await target.stub.ListLeases(pb.ListLeasesRequest(), metadata=md(admin))
        ).leases and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        decisions = await all_decisions(target.stub, admin)
        found = analyse(decisions, kill_seqs, capacity)
        lost: list[str] = []
        acked_leases = {lid for ids in seen.acked.values() for lid in ids}
        grants: Counter[str] = found["grants"]  # type: ignore[assignment]
        ends: set[str] = found["ends"]  # type: ignore[assignment]
        for lid in sorted(acked_leases):
            if lid not in grants:
                lost.append(f"{lid}: acknowledged, not in the journal")
                continue
            try:
                lease = await target.stub.GetLease(
                    pb.GetLeaseRequest(lease_id=lid), metadata=md(admin)
                )
                ended = lease.HasField("ended_at")
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                ended = True  # forgotten: only the journal's end decision says how it ended
            if not ended:
                lost.append(f"{lid}: still live after every lease should have run out")
            elif lid not in ends:
                lost.append(f"{lid}: ended without a journaled decision")
        for lid in sorted(seen.released):
            if lid not in ends:
                lost.append(f"{lid}: release acknowledged, not in the journal")
        dup = [f"key {k}: {sorted(v)}" for k, v in seen.acked.items() if len(v) > 1]
        owners = Counter(lid for ids in seen.acked.values() for lid in ids)
        dup += [f"{lid} acknowledged for {n} keys" for lid, n in owners.items() if n > 1]
        dup += [f"{lid} granted {n} times" for lid, n in grants.items() if n > 1]
        await target.channel.close()  # type: ignore[union-attr]
        return {
            **found,
            "lost": lost,
            "duplicated": dup,
            "crashed": crashed,
            "acked": len(acked_leases),
            "decisions": len(decisions),
        }

    try:
        found = asyncio.run(main())
        stopped = server.kill(signal.SIGTERM)
    finally:
        server.close()
    code, output = audit(state)
    counted = re.search(r"(\d+) mismatch", output)
    mismatches = int(counted.group(1)) if counted else -1
    rec, rdy = quantiles(recovery), quantiles(ready)
    per_commit = [round(e / c, 2) if c else 0.0 for c, e in batches]
    res.figures.update(
        kills=kills,
        agents=agents_n,
        burst_agents=bursts,
        commits=[{"commits": int(c), "entries": int(e)} for c, e in batches],
        entries_per_commit=per_commit,
        capacity=capacity,
        calls=seen.calls,
        retries_after_unavailable=seen.retries,
        answered_after_retry=dict(seen.answered_after_retry),
        acknowledged_grants=found["acked"],
        acknowledged_releases=len(seen.released),
        journal_decisions=found["decisions"],
        refused=dict(seen.refused),
        failed=dict(seen.failed),
        lost=len(found["lost"]),  # type: ignore[arg-type]
        duplicated=len(found["duplicated"]),  # type: ignore[arg-type]
        over_commits=len(found["over_commits"]),  # type: ignore[arg-type]
        peak_held=found["peak_held"],
        queued_at_kills=found["queued_at_kills"],
        withdrawn_at_restart=found["withdrawn_at_restart"],
        ghosts=len(found["ghosts"]),  # type: ignore[arg-type]
        pending_after_restart=pending_after_restart,
        recovery_s={k: (v if k == "n" else round(v, 3)) for k, v in rec.items()},
        ready_s={k: (v if k == "n" else round(v, 3)) for k, v in rdy.items()},
        audit_exit=code,
        audit_mismatches=mismatches,
        final_sigterm_exit=stopped,
    )
    res.lines += [
        f"{kills} SIGKILLs, {agents_n} agents, {gpus:.0f} GPUs: {found['acked']} grants and "
        f"{len(seen.released)} releases acknowledged, {seen.retries} retries after UNAVAILABLE "
        f"(answered on a retry: {dict(seen.answered_after_retry)})",
        f"lost {len(found['lost'])}, duplicated {len(found['duplicated'])}, "  # type: ignore[arg-type]
        f"over-commits {len(found['over_commits'])} (peak held {found['peak_held']} of {capacity}), "  # type: ignore[arg-type]
        f"ghosts {len(found['ghosts'])} ({found['queued_at_kills']} requests queued at a kill, "  # type: ignore[arg-type]
        f"{found['withdrawn_at_restart']} withdrawn by the restart)",
        f"recovery (kill to first answer) p50 {rec['p50']:.2f} s, max {rec['max']:.2f} s; "
        f"process start to listening p50 {rdy['p50']:.2f} s, max {rdy['max']:.2f} s",
        f"journal audit: {output.strip().splitlines()[0] if output.strip() else '?'}",
        f"journal entries per commit, each server (before its kill, the last at the end): "
        f"{per_commit}",
    ]
    for what in ("lost", "duplicated", "over_commits", "ghosts", "unresolved", "crashed"):
        items = found[what]
        if items:
            res.fail(f"{what}: {len(items)}: {list(items)[:5]}")  # type: ignore[arg-type]
    if seen.failed:
        res.fail(f"unexpected errors: {dict(seen.failed)}")
    if any(pending_after_restart):
        res.fail(f"requests pending right after a restart: {pending_after_restart}")
    if snapshot_over:
        res.fail(f"live leases above capacity right after a restart: {snapshot_over}")
    if code != 0 or mismatches != 0:
        res.fail(f"journal audit exit {code}: {output.strip()[:300]}")
    if stopped != 0:
        res.fail(f"the last server exited {stopped} on SIGTERM")
    if not any(e > c for c, e in batches):
        res.fail(f"no commit held more than one entry ({batches}): the load never overlapped")
    return res
