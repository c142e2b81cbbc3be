"""The campaign behaviours of the agent-burst scenario as agent programs, written once.

Each agent is a small dataclass of parameters with ``async def run(self, ctx)``; it awaits
only what ``ctx`` (``bursar.workflows.api.Ctx``) gives it, so the same program runs in
virtual time in the simulator and against a live broker over gRPC. Agents record what
they observe (latencies, tasks done) with ``ctx.record``; the broker never sees that.

Polling is coarse on purpose (tens of seconds to minutes): two simulated hours must stay
a few thousand broker events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bursar.workflows.api import Ctx, Lease, Refused
from bursar.workflows.tasks import TIME_EPS_S, Task, run_task, task_set

__all__ = ["Adaptive", "Backfill", "Extractor", "Naive", "Probe", "Storm", "Victim"]


def _floor8(x: float) -> float:
    return 8.0 * math.floor(max(0.0, x) / 8.0)


@dataclass
class Victim:
    """Small periodic interactive requests, always within its own guarantee: the isolation
    probe. Records the latency from request to usable lease."""

    period_s: float = 60.0
    sizes: tuple[float, ...] = (8.0, 16.0)
    hold_s: tuple[float, float] = (30.0, 100.0)
    duration_s: float = 120.0
    max_leases: int = 2
    until: float = math.inf

    async def run(self, ctx: Ctx) -> None:
        held: list[Lease] = []
        while ctx.now() < self.until:
            await ctx.sleep(self.period_s * ctx.rng.uniform(0.8, 1.2))
            held[:] = [x for x in held if x.expires_at > ctx.now()]
            if len(held) >= self.max_leases:
                continue
            size = ctx.rng.choice(self.sizes)
            t0 = ctx.now()
            try:
                lease = await ctx.acquire(size, self.duration_s, blocking=True, timeout=30.0)
            except Refused as exc:
                ctx.record("latency", campaign=ctx.campaign, at=t0, latency=None, why=exc.reason)
                continue
            ok = await ctx.wait_active(lease)
            ctx.record(
                "latency",
                campaign=ctx.campaign,
                at=t0,
                latency=(ctx.now() - t0) if ok else None,
                gpus=size,
            )
            held.append(lease)
            ctx.spawn(self._use(ctx, lease, held), "victim-use")

    async def _use(self, ctx: Ctx, lease: Lease, held: list[Lease]) -> None:
        await ctx.sleep(ctx.rng.uniform(*self.hold_s))
        await ctx.release(lease)
        if lease in held:
            held.remove(lease)


@dataclass
class Probe:
    """A standard request (128 GPUs) every ``period_s``, timed to full capacity."""

    gpus: float = 128.0
    period_s: float = 300.0
    hold_s: float = 60.0
    start_s: float = 150.0
    until: float = math.inf

    async def run(self, ctx: Ctx) -> None:
        await ctx.sleep(self.start_s)
        while ctx.now() < self.until:
            t0 = ctx.now()
            try:
                lease = await ctx.acquire(
                    self.gpus, self.hold_s + 300.0, blocking=True, timeout=self.period_s - 10
                )
            except Refused as exc:
                ctx.record("latency", campaign=ctx.campaign, at=t0, latency=None, why=exc.reason)
            else:
                ok = await ctx.wait_active(lease)
                ctx.record(
                    "latency",
                    campaign=ctx.campaign,
                    at=t0,
                    latency=(ctx.now() - t0) if ok else None,
                    path=lease.path.lower(),  # "warm", "reclaim", "cold"
                    gpus=self.gpus,
                )
                await ctx.sleep(self.hold_s)
                await ctx.release(lease)
            await ctx.sleep(max(0.0, t0 + self.period_s - ctx.now()))


@dataclass
class Backfill:
    """The facility's preemptible filler: every ``period_s`` asks for whatever idle capacity
    the supply signals show beyond the warm headroom (warm or cold), in chunks."""

    period_s: float = 60.0
    chunk: float = 64.0
    duration_s: float = 1800.0
    headroom: float = 32.0
    until: float = math.inf

    async def run(self, ctx: Ctx) -> None:
        while ctx.now() < self.until:
            s = await ctx.supply()
            # Warm first, in chunks that are all warm (a lease that also waits for a boot
            # may not sit on a lent reserve meanwhile), then cold.
            warm = _floor8(s.available_warm + s.lendable - self.headroom)
            for want in (warm, _floor8(s.cold + min(0.0, warm))):
                while want >= 8:
                    size = min(self.chunk, want)
                    try:
                        await ctx.acquire(size, self.duration_s, blocking=False)
                    except Refused:
                        want = 0.0
                        break
                    want -= size
            await ctx.sleep(self.period_s)


@dataclass
class Storm:
    """Adversarial: from ``start_s`` for ``length_s`` hammers burst-ceiling requests
    (halving the size after each refusal, back up after a grant), and spams inference at
    ``tokens_per_s`` through Meter."""

    start_s: float = 1800.0
    length_s: float = 1800.0
    burst: float = 384.0
    lease_s: float = 300.0
    retry_s: float = 10.0
    tokens_per_s: float = 200.0
    meter_every_s: float = 10.0

    async def run(self, ctx: Ctx) -> None:
        await ctx.sleep(self.start_s)
        end = self.start_s + self.length_s
        ctx.spawn(self._spam(ctx, end), "storm-inference")
        size = self.burst
        while ctx.now() < end:
            s = await ctx.supply()
            size = min(size, _floor8(self.burst - s.held))
            if size < 8:
                await ctx.sleep(self.retry_s)
                size = self.burst
                continue
            try:
                await ctx.acquire(size, self.lease_s, blocking=False)
                size = self.burst
            except Refused as exc:
                size = max(8.0, _floor8(size / 2))
                await ctx.sleep(max(self.retry_s, min(exc.retry_after, 60.0)))

    async def _spam(self, ctx: Ctx, end: float) -> None:
        while ctx.now() < end:
            r = await ctx.meter("inference", self.tokens_per_s * self.meter_every_s)
            ctx.record("inference", campaign=ctx.campaign, at=ctx.now(), granted=r.granted)
            await ctx.sleep(self.meter_every_s)


@dataclass
class Extractor:
    """The enforcement experiment's adversary: gets as many GPU-seconds above its
    sustained rate as the broker lets it. From ``start_s`` it asks for its burst ceiling
    (less what it holds) in leases of ``lease_s``; when that is refused for its bucket (or
    can never be granted: prepaid, more above R than the bucket holds) it asks at once for
    the largest size its current bucket level pays for, and otherwise retries when the
    broker says. It knows only its own envelope and what the supply signals show."""

    sustained: float = 32.0
    burst: float = 384.0
    lease_s: float = 600.0
    start_s: float = 0.0
    retry_s: float = 10.0
    until: float = math.inf

    async def run(self, ctx: Ctx) -> None:
        await ctx.sleep(self.start_s)
        while ctx.now() < self.until:
            s = await ctx.supply()
            want = _floor8(self.burst - s.held)
            if want < 8:
                await ctx.sleep(self.retry_s)
                continue
            refused = await self._ask(ctx, want)
            if refused is None:
                continue
            if refused.reason in ("BUCKET_EMPTY", "OUT_OF_RANGE"):
                # What the level pays for: the part below R is free, the rest costs
                # lease_s tokens per GPU.
                paid = max(0.0, self.sustained - s.held) + s.bucket / self.lease_s
                size = _floor8(min(want, paid))
                if 8 <= size < want:
                    refused = await self._ask(ctx, size)
                    if refused is None:
                        continue
            await ctx.sleep(max(self.retry_s, min(refused.retry_after, 60.0)))

    async def _ask(self, ctx: Ctx, gpus: float) -> Refused | None:
        try:
            await ctx.acquire(gpus, self.lease_s, blocking=False)
        except Refused as exc:
            ctx.record("ask", campaign=ctx.campaign, at=ctx.now(), gpus=gpus, refused=exc.reason)
            return exc
        ctx.record("ask", campaign=ctx.campaign, at=ctx.now(), gpus=gpus, refused=None)
        return None


@dataclass
class _Science:
    seed: int = 0
    tasks: list[Task] = field(default_factory=list)

    def queue(self) -> list[Task]:
        return list(self.tasks) if self.tasks else task_set(self.seed)


@dataclass
class Naive(_Science):
    """Same task set as adaptive; demands ``gpus`` GPUs always, whatever the price, and is
    blind to I/O: its lease is sized to the compute time only and never renewed, so a task
    that I/O throttling slows down is lost when the lease ends.

    Each lease lasts the longest compute time among the tasks at the head of the queue
    that fill its GPUs. As GPUs free up (by its own bookkeeping: a task takes its compute
    time) it starts the next task if that task's compute time fits what is left of the
    lease; once the head of the queue does not fit, it lets the lease run out and sizes the
    next one. It adds no overhead of its own: none for I/O, which it ignores, and none for
    start-up, since a lease's time runs from when it is usable, when its tasks start. A
    task that cannot fit any lease (longer than ``max_lease_s``, the broker's longest
    lease, or wider than ``gpus``) is recorded as ``unfit`` and never started; so is the
    task that sized a lease the broker says it will never grant (under prepaid
    enforcement, more above the sustained rate than the whole bucket holds)."""

    gpus: float = 256.0
    max_lease_s: float = 86400.0
    """The broker's longest lease (the policy default; the scenario passes its policy's)."""

    async def run(self, ctx: Ctx) -> None:
        todo = self._fitting(ctx, self.queue())
        while todo:
            batch = self._batch(todo)
            lease_s = min(max(t.duration_s for t in batch), self.max_lease_s)
            try:
                lease = await ctx.acquire(self.gpus, lease_s, blocking=True, timeout=3600.0)
            except Refused as exc:
                if math.isinf(exc.retry_after):
                    longest = max(batch, key=lambda t: t.duration_s)
                    todo.remove(longest)
                    self._unfit(ctx, longest, exc.reason)
                continue
            if not await ctx.wait_active(lease):
                continue
            free = self.gpus
            running: list[tuple[float, Task]] = []
            # Pack tasks onto the lease in queue order while the head's compute time fits
            # what is left of it; start the next as soon as GPUs free up.
            while todo and ctx.now() + todo[0].duration_s <= lease.expires_at + TIME_EPS_S:
                if todo[0].gpus <= free:
                    t = todo.pop(0)
                    free -= t.gpus
                    running.append((ctx.now(), t))
                    ctx.spawn(self._task(ctx, t, lease), f"naive-{t.id}")
                    continue
                # Naive bookkeeping: it expects each task to take its compute time.
                nxt = min(s + t.duration_s for s, t in running)
                await ctx.sleep(max(1.0, nxt - ctx.now()))
                still = [(s, t) for s, t in running if s + t.duration_s > ctx.now()]
                free += sum(t.gpus for _, t in running) - sum(t.gpus for _, t in still)
                running = still
            await ctx.wait_end(lease)

    def _fitting(self, ctx: Ctx, tasks: list[Task]) -> list[Task]:
        """The tasks some lease can hold; the others are reported, not silently lost."""
        out = []
        for t in tasks:
            if t.duration_s > self.max_lease_s:
                self._unfit(ctx, t, "LONGER_THAN_MAX_LEASE")
            elif t.gpus > self.gpus:
                self._unfit(ctx, t, "WIDER_THAN_LEASE")
            else:
                out.append(t)
        return out

    def _unfit(self, ctx: Ctx, t: Task, why: str) -> None:
        ctx.record(
            "unfit",
            id=t.id,
            gpus=t.gpus,
            value=t.value,
            duration_s=t.duration_s,
            why=why,
            max_lease_s=self.max_lease_s,
            lease_gpus=self.gpus,
        )

    def _batch(self, todo: list[Task]) -> list[Task]:
        """The head tasks that fill the lease's GPUs: they size it."""
        free, out = self.gpus, []
        for t in todo:
            if t.gpus > free:
                break
            free -= t.gpus
            out.append(t)
        return out

    async def _task(self, ctx: Ctx, task: Task, lease: Lease) -> None:
        await run_task(ctx, task, lease, renew=False)


@dataclass
class Adaptive(_Science):
    """Reads the supply signals every ``period_s``: runs a task when its value per GPU-hour
    clears the price (by ``margin``), stays at its sustained rate unless a task is worth
    ``above_r_factor`` times the price (conserving its bucket), mops up cheap capacity when
    the price is near base, paces its I/O to its fs_bw bucket, leases each task with slack
    for I/O and renews when throttled, and releases as soon as a task is done."""

    period_s: float = 120.0
    sustained: float = 128.0
    burst: float = 384.0
    margin: float = 1.0
    above_r_factor: float = 2.0
    cheap_price: float = 1.5
    fs_sustained: float = 500.0
    io_reserve_mb: float = 200_000.0
    _io: float = 0.0

    async def run(self, ctx: Ctx) -> None:
        todo = self.queue()
        self._io = 0.0
        while todo:
            s = await ctx.supply()
            held = s.held
            skipped: list[Task] = []
            while todo:
                t = todo.pop(0)
                worth = t.value_per_gpu_hour >= self.margin * s.price
                cheap = s.price <= self.cheap_price
                room_r = self.sustained - held
                room_burst = self.burst - held
                fits = t.gpus <= room_r or (
                    t.gpus <= room_burst
                    and (cheap or t.value_per_gpu_hour >= self.above_r_factor * s.price)
                )
                # Pace I/O: within the sustained fs_bw rate, or while the bucket is well stocked.
                io_ok = (
                    self._io + t.io_rate <= self.fs_sustained or s.fs_bw_bucket > self.io_reserve_mb
                )
                if not (worth and fits and io_ok) or t.gpus > s.available_warm + s.reclaimable:
                    skipped.append(t)
                    if len(skipped) > 20:
                        break
                    continue
                try:
                    lease = await ctx.acquire(t.gpus, t.duration_s * 1.25 + 120.0, blocking=False)
                except Refused:
                    skipped.append(t)
                    break
                held += t.gpus
                self._io += t.io_rate
                ctx.spawn(self._task(ctx, t, lease), f"adaptive-{t.id}")
            todo = skipped + todo
            await ctx.sleep(self.period_s)

    async def _task(self, ctx: Ctx, task: Task, lease: Lease) -> None:
        if await ctx.wait_active(lease):
            await run_task(ctx, task, lease, renew=True)
        self._io -= task.io_rate
        await ctx.release(lease)
