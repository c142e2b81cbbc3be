"""``bursar acquire``: hold a lease while a command runs, as ``salloc`` does.

The lease is acquired (blocking, up to ``--timeout``), renewed in the background by the
client library's held lease, and released when the command exits, when this process gets
SIGINT or SIGTERM (forwarded to the command first, which then decides when to exit), or
when the broker ends the lease (revoked or expired: the command is sent SIGTERM, then
SIGKILL after a grace period; released, e.g. by the command itself with ``bursar
release``, the command goes on). The exit status is the command's (128+N when a signal N ended it), as with
``salloc``. Without a command the lease is printed and held until interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import click

from bursar.broker.elastic import SPEED_MODELS
from bursar.cli.client import (
    CONTEXT,
    broker_client,
    campaign_option,
    connection_options,
    options,
    print_json_line,
    run_call,
    stdout_console,
)
from bursar.cli.console import human_duration, iso_time
from bursar.cli.leases import parse_labels, parse_units
from bursar.cli.verbs import at, ended_how, lease_summary
from bursar.providers.client import (
    Intent,
    Lease,
    LeaseHandle,
    LeaseState,
    PendingRequest,
    Unavailable,
)
from bursar.providers.client_view import leases_table
from bursar.providers.launch import is_slurm, launch_argv, slurm_job_id

__all__ = ["KILL_AFTER_S", "WAIT_NOTICE_S", "acquire_command", "lease_env"]

KILL_AFTER_S = 10.0
"""How long the command has to exit after SIGTERM, once its lease has ended."""

WAIT_NOTICE_S = 15.0
"""When a waiting acquire first says it is still waiting; the notices then come twice as
far apart each time, up to ``WAIT_NOTICE_MAX_S`` (an hour's wait is a dozen lines, not
240)."""

WAIT_NOTICE_MAX_S = 600.0

QUEUED_POLL_S = 1.0
"""How often a waiting acquire reads why its request waits (a line whenever that changes)."""

_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def lease_env(lease: Lease, base: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: ``base`` and the lease's variables (and, on Slurm, the
    allocation's job id, so that ``srun`` inside the command runs in it)."""
    env = dict(base)
    env["BURSAR_LEASE_ID"] = lease.id
    env["BURSAR_CAMPAIGN"] = lease.campaign
    env["BURSAR_LEASE_NODES"] = ",".join(lease.nodes)
    env["BURSAR_LEASE_SIZE"] = ",".join(f"{k}={v:g}" for k, v in sorted(lease.size.items()))
    env["BURSAR_LEASE_EXPIRES_AT"] = f"{lease.expires_at:.3f}"
    job = slurm_job_id(lease)
    if job is not None:
        env["SLURM_JOB_ID"] = str(job)
    return env


def _say(text: str) -> None:
    # The command owns stdout; what bursar has to say goes to stderr.
    click.echo(f"bursar acquire: {text}", err=True)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@click.command(
    "acquire",
    context_settings={**CONTEXT, "allow_interspersed_args": False},
)
@click.option(
    "--size",
    "sizes",
    multiple=True,
    required=True,
    metavar="DIM=UNITS,...",
    help="Units per placed dimension, e.g. gpu=8 or gpu=8,cpu=64; repeatable.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="The lease's life between renewals; it is renewed while held.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="How long to wait for the grant (0: only if it can be granted now). Default: the "
    "broker's longest wait.",
)
@click.option(
    "--label", "labels", multiple=True, metavar="KEY=VALUE", help="Lease labels; repeatable."
)
@click.option(
    "--max",
    "max_size",
    metavar="DIM=UNITS,...",
    help="An elastic lease: granted at --size, grown toward this while spare capacity "
    "lasts, shrunk when others need it (needs --work and --deadline).",
)
@click.option(
    "--work",
    type=click.FloatRange(min=0, min_open=True),
    metavar="UNITS",
    help="Elastic: the work left, in the speedup model's units (Amdahl: seconds on one unit).",
)
@click.option(
    "--deadline",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Elastic: the deadline, seconds from now.",
)
@click.option(
    "--amdahl",
    type=click.FloatRange(0, 1),
    metavar="FRACTION",
    help="Elastic: Amdahl's serial fraction (default 0, unless --curve is given).",
)
@click.option(
    "--curve",
    metavar="UNITS:THROUGHPUT,...",
    help="Elastic: measured throughput points spanning --size to --max, instead of --amdahl.",
)
@click.option(
    "--speed-model",
    type=click.Choice(list(SPEED_MODELS)),
    default=SPEED_MODELS[0],
    show_default=True,
    help="Elastic: a --curve known at its points only (measured) or linear between them.",
)
@click.option(
    "--sizes",
    "allowed",
    metavar="UNITS,...",
    help="Elastic: the sizes (units of the speedup dimension) the job can use; --size among them.",
)
@click.option(
    "--size-rule",
    metavar="RULE",
    help="Elastic: powers_of_two, or divisors_of:B (the counts dividing a global batch of B).",
)
@campaign_option
@connection_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD [ARGS]...]")
def acquire_command(
    sizes: tuple[str, ...],
    duration: float,
    timeout: float | None,
    labels: tuple[str, ...],
    command: tuple[str, ...],
    **elastic: Any,
) -> None:
    """Acquire a lease, run CMD in it, release it when CMD exits (like salloc).

    Waits for the grant (saying so on stderr), then runs CMD with the lease in its
    environment: BURSAR_LEASE_ID, BURSAR_CAMPAIGN, BURSAR_LEASE_NODES (comma-separated),
    BURSAR_LEASE_SIZE and BURSAR_LEASE_EXPIRES_AT. On a Slurm-backed broker CMD runs as a
    step of the lease's allocation (srun --jobid=N ..., one task per node) and
    SLURM_JOB_ID is set. The lease is renewed while CMD runs. Ctrl-C or SIGTERM is
    forwarded to CMD, and the lease is released once CMD has exited; if the broker ends
    the lease (revoked, preempted past its deadline, expired), CMD gets SIGTERM, then
    SIGKILL after 10 s (a lease released with `bursar release` leaves CMD running). Exits with CMD's status (128+N if signal N ended it); 1 if no lease was
    granted, 2 for bad usage.

    Without CMD: prints the lease (a table, or one JSON line with --json) and holds it,
    renewed, until interrupted (Ctrl-C or SIGTERM), then releases it and exits 0.

    With --max the lease is elastic and deadline-aware: granted at --size, grown toward
    --max while spare capacity lasts and shrunk when others need it, on the sizes --sizes
    and --size-rule allow. CMD's environment names the size it was granted; it is not told
    of resizes (the Python client's held lease follows them).

    \b
    Examples:
      bursar acquire --size gpu=8 --token-file state/tokens.json --campaign storm \\
          -- python train.py --epochs 3
      bursar acquire --size gpu=8,cpu=64 --duration 1800 --timeout 60 -- ./run.sh
      bursar acquire --size gpu=2 --max gpu=16 --size-rule powers_of_two --work 36000 \\
          --deadline 7200 --curve 1:1,2:1.9,4:3.6,8:6.5,16:11 -- ./train.sh
    """
    o = options()
    size: dict[str, float] = {}
    for text in sizes:
        size.update(parse_units(text, "--size"))
    intent = _intent(size, **elastic)  # the elastic options, as _intent names them
    label_map = parse_labels(labels)
    argv = list(command)

    async def go() -> int:
        async with broker_client(o, forever=False) as client:
            wait = "as long as the broker allows" if timeout is None else f"up to {timeout:g} s"
            _say(
                f"waiting for a lease of {','.join(f'{k}={v:g}' for k, v in size.items())} "
                f"({wait})..."
            )
            handle = client.held_lease(
                {} if intent is not None else size,
                duration,
                intent=intent,
                timeout=timeout,
                labels=label_map or None,
                on_queued=_queued,
                queued_poll_s=QUEUED_POLL_S,
            )
            async with contextlib.AsyncExitStack() as stack:
                ticker = asyncio.create_task(_still_waiting(time.monotonic()))
                try:
                    h = await stack.enter_async_context(handle)
                finally:
                    ticker.cancel()
                now = client.clock.now()
                _say(f"granted {lease_summary(h.lease, now)}")
                if not h.active.is_set():
                    _say(f"waiting for it to start ({at(h.lease.starts_at, now)})...")
                    await _until(h.active, h.ended)
                if h.ended.is_set():
                    _say("the lease ended before it started")
                    return 1
                if not argv:
                    return await _hold(h, o.json)
                return await _run(h, argv)
        raise AssertionError("unreachable")  # the stack returns or raises

    status = run_call(go)
    sys.exit(status)


def _intent(
    size: dict[str, float],
    max_size: str | None,
    work: float | None,
    deadline: float | None,
    amdahl: float | None,
    curve: str | None,
    speed_model: str,
    allowed: str | None,
    size_rule: str | None,
) -> Intent | None:
    """The elastic intent the options describe; None without --max. The broker checks the
    values (naming the intent's field it refuses); here only what the options must say."""
    if max_size is None:
        given = [
            flag
            for flag, v in (
                ("--work", work),
                ("--deadline", deadline),
                ("--amdahl", amdahl),
                ("--curve", curve),
                ("--sizes", allowed),
                ("--size-rule", size_rule),
            )
            if v is not None
        ]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only for an elastic lease (give --max)")
        return None
    if work is None or deadline is None:
        raise click.UsageError("--max (an elastic lease) needs --work and --deadline")
    if curve is not None and amdahl is not None:
        raise click.UsageError("give --amdahl or --curve, not both")
    return Intent(
        min=size,
        max=parse_units(max_size, "--max"),
        work=work,
        deadline_s=deadline,
        amdahl=None if curve is not None else (amdahl or 0.0),
        curve=_numbers(curve, "--curve", 2) if curve is not None else (),
        speed_model=speed_model,
        sizes=tuple(u for (u,) in _numbers(allowed, "--sizes", 1)) if allowed else (),
        size_rule=size_rule or "",
    )


def _numbers(text: str, flag: str, per: int) -> tuple[tuple[float, ...], ...]:
    """``1:1.0,2:1.9`` (``per`` numbers an item, ``:`` between them) as tuples of floats."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) != per:
                raise ValueError
            out.append(tuple(float(x) for x in parts))
        except ValueError:
            shape = ":".join(["NUMBER"] * per)
            raise click.UsageError(f"{flag}: {item.strip()!r} is not {shape}") from None
    return tuple(out)


def _queued(p: PendingRequest) -> None:
    """Why the request waits and until when, each time that changes."""
    text = (
        f"queued as {p.request_id}: {p.reason.value}, estimated wait "
        f"{human_duration(p.estimated_wait_s)}, position {p.position}"
    )
    if p.reserved_at is not None:
        text += f", reserved from {iso_time(p.reserved_at)}"
    _say(text)


async def _still_waiting(t0: float) -> None:
    """A line now and then while the grant is awaited (a blocking Acquire is one call)."""
    gap = WAIT_NOTICE_S
    while True:
        await asyncio.sleep(gap)
        _say(f"still waiting for the grant ({human_duration(time.monotonic() - t0)})...")
        gap = min(gap * 2.0, WAIT_NOTICE_MAX_S)


async def _until(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _on_signals(loop: asyncio.AbstractEventLoop, handler: object) -> None:
    for sig in _FORWARDED:
        loop.add_signal_handler(sig, handler, sig)  # type: ignore[arg-type]


def _off_signals(loop: asyncio.AbstractEventLoop) -> None:
    for sig in _FORWARDED:
        loop.remove_signal_handler(sig)


async def _hold(h: LeaseHandle, json_out: bool) -> int:
    """Print the lease and hold it until SIGINT/SIGTERM or its end."""
    if json_out:
        print_json_line(h.lease.to_json())
    else:
        stdout_console().print(leases_table([h.lease], h.lease.granted_at))
        sys.stdout.flush()
    _say("holding it (renewed) until Ctrl-C or SIGTERM")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    _on_signals(loop, lambda _sig: stop.set())
    try:
        await _until(stop, h.ended)
    finally:
        _off_signals(loop)
    if h.ended.is_set() and not stop.is_set():
        _say(f"the broker ended it: {lease_summary(h.lease, h.lease.ended_at or 0.0)}")
        return 1
    await _release(h, "interrupted")
    return 0


async def _run(h: LeaseHandle, argv: Sequence[str]) -> int:
    """Run ``argv`` in the lease; forward signals; stop it if the lease ends."""
    lease = h.lease
    full = launch_argv(lease, argv)
    if is_slurm(lease):
        _say(f"running in Slurm job {slurm_job_id(lease)}: {' '.join(full)}")
    try:
        proc = await asyncio.create_subprocess_exec(*full, env=lease_env(lease, os.environ))
    except OSError as exc:
        _say(f"cannot run {argv[0]}: {exc.strerror or exc}")
        return 127 if isinstance(exc, FileNotFoundError) else 126
    loop = asyncio.get_running_loop()

    def forward(sig: int) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    _on_signals(loop, forward)
    waiter = asyncio.ensure_future(proc.wait())
    ended = asyncio.ensure_future(h.ended.wait())
    preempted = asyncio.ensure_future(h.preempted.wait())
    pending: set[asyncio.Future[object]] = {waiter, ended, preempted}  # type: ignore[arg-type]
    try:
        while not waiter.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if preempted in done:
                _say(
                    f"the broker will reclaim {lease.id} at "
                    f"{at(h.preempt_deadline, time.time())}: finish up"
                )
            if ended in done and not waiter.done() and h.lease.state is LeaseState.RELEASED:
                # Released on purpose (the command may do so itself): nothing to stop.
                _say(f"{lease.id} was released; waiting for the command to exit")
            elif ended in done and not waiter.done():
                _say(f"the lease ended ({h.lease.end_cause or 'ended'}): stopping the command")
                forward(signal.SIGTERM)
                try:
                    await asyncio.wait_for(asyncio.shield(waiter), KILL_AFTER_S)
                except TimeoutError:
                    forward(signal.SIGKILL)
                    await waiter
    finally:
        _off_signals(loop)
        for t in (ended, preempted):
            t.cancel()
    code = proc.returncode
    assert code is not None
    await _release(h, f"command exited with status {_exit_status(code)}")
    return _exit_status(code)


async def _release(h: LeaseHandle, what: str) -> None:
    """Release the lease and say what became of it: released now, or already ended (the
    command may have released it itself: the broker's answer tells which)."""
    try:
        final = await h.release()
    except Unavailable:
        _say(f"{what}; the broker cannot be reached: {h.lease.id} expires on its own")
        return
    if h.released_here:
        _say(f"{what}; released {final.id}")
    else:
        _say(f"{what}; {final.id} had already ended ({ended_how(final)})")
