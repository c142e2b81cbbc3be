"""The broker's Prometheus metrics on a live scrape: what a dashboard asks of them (held
units against the envelope, why requests wait, how long a grant takes to be usable, the
RPCs), no infinite samples, ``promtool check metrics`` clean, and the Grafana dashboard in
deploy/grafana/ naming only metrics the broker exports."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

from conftest import missing_system_part
from service_support import START, asleep_until, run, serve, until

from bursar.broker.clock import ManualClock
from bursar.broker.service.metrics import METRIC_NAMES
from bursar.protos.bursar.v1 import broker_pb2 as pb

DASHBOARD = Path(__file__).resolve().parent.parent.parent / "deploy" / "grafana" / "bursar.json"
PROMTOOL = Path("/usr/bin/promtool")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def _samples(body: str) -> dict[str, float]:
    """``name{labels}`` -> value, for every sample line of an exposition."""
    out = {}
    for line in body.splitlines():
        if line.startswith("#") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, line
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


async def _scrape(c) -> str:  # type: ignore[no-untyped-def]
    c.core.metrics.refresh(c.core.runtime, c.core.now(), 0)
    url = f"http://127.0.0.1:{c.running.metrics_port}/metrics"
    raw = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    return raw.decode()


def _live_scrape(tmp_path: Path) -> str:
    async def scenario() -> str:
        clock = ManualClock(START)
        async with serve(tmp_path, metrics_port=0, clock=clock) as c:
            await _scrape(c)  # the per-call series count from the first scrape on
            await c.acquire("sci", 16, duration_s=100)  # warm: usable at once
            cold = (await c.acquire("sci", 8, duration_s=100)).lease  # the cold node boots
            assert cold.path == pb.LEASE_PATH_COLD
            waiting = asyncio.ensure_future(c.acquire("other", 8, timeout_s=60))
            await until(lambda: bool(c.core.engine.pending))
            await asleep_until(clock, cold.starts_at)
            clock.set(cold.starts_at)
            await until(lambda: c.core.engine.leases[cold.lease_id].state.value == "active")
            body = await _scrape(c)
            waiting.cancel()
            return body

    return run(scenario())


def test_a_live_scrape_answers_the_dashboards_questions(tmp_path: Path) -> None:
    body = _live_scrape(tmp_path)
    s = _samples(body)
    # Held units against the envelope, per campaign and dimension.
    assert s['bursar_held_units{campaign="sci",dim="gpu"}'] == 24
    assert s['bursar_envelope_burst_units{campaign="sci",dim="gpu"}'] == 24
    assert s['bursar_envelope_sustained_units{campaign="sci",dim="gpu"}'] == 8
    assert s['bursar_envelope_guarantee_units{campaign="sci",dim="gpu"}'] == 0
    # Why requests wait: decisions by kind, campaign and reason.
    assert s['bursar_decisions_total{campaign="other",kind="queue",reason="POOL_FULL"}'] == 1
    assert s['bursar_decisions_total{campaign="sci",kind="grant",reason=""}'] == 2
    # Grant -> usable: 0 on the warm path, the boot (0.6 s) on the cold one.
    assert s['bursar_time_to_usable_seconds_count{path="warm"}'] == 1
    assert s['bursar_time_to_usable_seconds_sum{path="warm"}'] == 0
    assert s['bursar_time_to_usable_seconds_count{path="cold"}'] == 1
    assert math.isclose(s['bursar_time_to_usable_seconds_sum{path="cold"}'], 0.6, abs_tol=1e-3)
    # RPC totals and latency.
    assert s['bursar_rpc_requests_total{code="OK",method="Acquire"}'] == 2
    assert s['bursar_rpc_duration_seconds_count{method="Acquire"}'] == 2
    # Supply as separate series; the renamed gauges carry their units.
    assert s['bursar_capacity_units{dim="gpu"}'] == 24
    assert s['bursar_warm_free_units{dim="gpu"}'] == 0
    assert "bursar_price_credits_per_unit_hour" in s and "bursar_pressure_ratio" in s
    assert any(k.startswith("bursar_build_info{") and v == 1 for k, v in s.items())
    # No infinite sample: the backfill campaign's unlimited bucket has no series at all.
    assert not [k for k, v in s.items() if not math.isfinite(v)]
    assert not any(k.startswith('bursar_bucket_level_unit_seconds{campaign="backfill"') for k in s)
    assert 'bursar_bucket_level_unit_seconds{campaign="sci",dim="gpu"}' in s
    # Every exported series is one METRIC_NAMES lists (what the dashboard test checks).
    assert {re.sub(r"\{.*", "", k) for k in s if k.startswith("bursar_")} <= METRIC_NAMES


def test_promtool_check_metrics_finds_nothing_on_a_live_scrape(tmp_path: Path) -> None:
    promtool = shutil.which("promtool") or (str(PROMTOOL) if PROMTOOL.exists() else None)
    if promtool is None:
        missing_system_part(f"{PROMTOOL} is not installed (scripts/system-deps.sh installs it)")
    body = _live_scrape(tmp_path)
    done = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.stdout + done.stderr
    )


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k == "expr" and isinstance(v, str)]
        q = node.get("query")
        if isinstance(q, dict) and isinstance(q.get("query"), str):
            found.append(q["query"])
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_the_grafana_dashboard_names_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dash)
    assert len(exprs) >= 10
    named: set[str] = set()
    for e in exprs:
        names = set(re.findall(r"\bbursar_[a-z0-9_]+", e))
        assert names, f"a query that names no broker metric: {e}"
        unknown = names - METRIC_NAMES
        assert not unknown, f"{e}: {sorted(unknown)} are not exported by the broker"
        named |= names
    # The questions the dashboard is for: held vs envelope, why waits, time to usable.
    for name in (
        "bursar_held_units",
        "bursar_envelope_burst_units",
        "bursar_decisions_total",
        "bursar_time_to_usable_seconds_bucket",
        "bursar_rpc_duration_seconds_bucket",
    ):
        assert name in named
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
