"""Shared builders for the engine tests (kept small: other test modules add their own).

Engine test modules import the builders directly (``from conftest import build_engine``);
the fixtures hand out the same builders to tests that prefer fixtures."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.events import CreateCampaign
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec

# Property tests judge behaviour, not speed: on a loaded two-core CI machine an example
# can take seconds, and a per-example deadline or a too-slow health check would then fail
# a correct test. Tests that set their own settings keep them; these are the defaults.
settings.register_profile("bursar", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("bursar")

# A pytest-xdist worker (make test runs the in-process tests on several) starts with COLUMNS
# and LINES set (80 x 24), where a plain run off a terminal has neither: the commands' tests
# read what a command prints off a terminal (cli/console.py: full width unless COLUMNS is
# set), so a worker runs them as a plain run would.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

# The reliability suite's helpers (its `Server` process wrapper) are the tests' too: one copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "reliability"))


CHROMIUM = Path("/usr/bin/chromium")


def missing_system_part(why: str) -> None:
    """Skip a test whose system part (Chromium, PostgreSQL, Slurm, ...) is not here; fail
    instead under BURSAR_REQUIRE_SYSTEM_TESTS=1, as CI runs."""
    if os.environ.get("BURSAR_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(f"{why}: run scripts/system-deps.sh (as root) and install the dev extra")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium driven by Playwright (the dashboard's page tests)."""
    if not CHROMIUM.exists():
        missing_system_part(f"{CHROMIUM} is not installed (scripts/system-deps.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_system_part("playwright is not installed (the dev extra has it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def open_dashboard(browser: Any, url: str, token: str) -> Any:
    """A new page on the dashboard at ``url``, signed in with ``token`` and live; its
    JavaScript errors collect in ``page.errors``."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.fill("#token", token)
    page.click("#signin button")
    page.wait_for_selector("#live.on")
    page.errors = errors  # type: ignore[attr-defined]
    return page


def build_engine(
    *,
    nodes: int = 8,
    warm: int = 4,
    gpu: float = 8,
    cpu: float = 64,
    mem_gb: float = 512,
    boot_latency_s: float = 60,
    campaigns: Iterable[CampaignSpec] = (),
    **policy: object,
) -> Engine:
    """An engine over ``nodes`` identical nodes (``warm`` of them powered) with its
    campaigns created at t=0. Policy defaults: grace 30 s, warm headroom 8 GPUs."""
    policy.setdefault("grace_s", 30)
    policy.setdefault("warm_headroom", {"gpu": 8})
    pool = PoolSpec(
        groups=(
            NodeGroup(count=nodes, resources={"gpu": gpu, "cpu": cpu, "mem_gb": mem_gb}, warm=warm),
        ),
        boot_latency_s=boot_latency_s,
    )
    eng = Engine(pool, PolicySpec(**policy))  # type: ignore[arg-type]
    for spec in campaigns:
        eng.apply(CreateCampaign(at=0, spec=spec))
    return eng


def gpu_campaign(
    name: str,
    guarantee: float = 0,
    sustained: float = 0,
    burst: float = 0,
    bucket: float | None = None,
    lease_class: LeaseClass = LeaseClass.BATCH,
    preemptible: bool = False,
    extra: Mapping[str, DimEnvelope] | None = None,
) -> CampaignSpec:
    """A campaign with a GPU envelope (plus any ``extra`` dimensions' envelopes)."""
    envelopes = {"gpu": DimEnvelope(guarantee, sustained, burst, bucket), **(extra or {})}
    return CampaignSpec(name, envelopes, lease_class, preemptible)


@pytest.fixture
def make_engine() -> Callable[..., Engine]:
    return build_engine


@pytest.fixture
def gpu_spec() -> Callable[..., CampaignSpec]:
    return gpu_campaign


# The fast lane (`make test-fast`, `pytest -m "not slow"`) leaves out whole modules that
# need something outside this process: a `bursar serve` subprocess, a browser, a Slurm
# cluster, PostgreSQL, Ray, Parsl or a Dask cluster, or the documentation build. Tests
# marked `slow` in other modules are left out too. `make test` (and CI) runs everything.
HEAVY_MODULES = frozenset(
    {
        # a `bursar serve` (or benchmark) subprocess
        "test_accel",
        "test_bench_restart",
        "test_benchmarks",
        "test_cli_conventions",
        "test_cli_explain",
        "test_dashboard",
        "test_docs_commands",
        "test_examples",
        "test_journal_checkpoints",
        "test_packaging",
        "test_reliability",
        "test_reliability_input",
        "test_self_contained",
        "test_service_process",
        "test_traces_fetch",
        "test_traces_sample",
        # a browser
        "test_dashboard_browser",
        "test_sim_report",
        # Slurm
        "test_ray_slurm",
        "test_slurm_accounting",
        "test_slurm_actuation",
        "test_slurm_backend",
        "test_slurm_dask",
        "test_slurm_parsl",
        "test_slurm_service",
        # PostgreSQL
        "test_failover",
        "test_journal_pg",
        "test_standby_ops",
        # Ray, Parsl, Dask clusters, and real worker processes on this machine
        "test_block",
        "test_dask_cluster",
        "test_dask_elastic",
        "test_dask_example",
        "test_local_backend",
        "test_local_service",
        "test_parsl_elastic",
        "test_parsl_example",
        "test_parsl_workflow",
        "test_ray_autoscaler",
        "test_ray_elastic",
        "test_ray_one_host",
        "test_ray_provider",
        # the documentation site's strict build
        "test_docs_site",
    }
)


# Heavy modules whose subprocesses listen on nothing and time nothing (a compiled build,
# scripts run on files in a temporary folder): `make test` runs them on the workers with
# the in-process tests. The other heavy modules are `serial`: what they start shares the
# machine (ports, the test Slurm cluster, PostgreSQL, the cores their timings assume), so
# `make test` runs them one at a time, after the tests on the workers (pytest-xdist).
PARALLEL_HEAVY_MODULES = frozenset({"test_accel", "test_traces_sample"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow, serial = pytest.mark.slow, pytest.mark.serial
    for item in items:
        name = item.module.__name__.rpartition(".")[2] if item.module is not None else ""
        if name in HEAVY_MODULES:
            item.add_marker(slow)
            if name not in PARALLEL_HEAVY_MODULES:
                item.add_marker(serial)
