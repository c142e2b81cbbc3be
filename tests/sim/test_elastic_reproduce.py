"""The published elastic results reproduce: a fast subset of them is run again and each
run's hash (every event with its decisions) must be the one published. A change to the
engine's rules that alters what they show fails here until the results are regenerated
(``docs/results/elastic.md`` says how).

The subset: 195job under every policy (measured speeds), dmug on 195job with interpolated
speeds, and dmug on the first 2,000 jobs of cluster05 (``docs/elastic-deadlines.subset.json``).
The engine's full invariant check runs at the end of each run only: the hash does not
depend on it, and the other elastic tests check at every event."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bursar.sim.elastic.runner import CLUSTERS, run
from bursar.sim.elastic.trace import load_curves, load_jobs

DOCS = Path(__file__).resolve().parents[2] / "docs"
TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)
ITP = TRACES / "elasticflow-itp"


def _published(name: str) -> dict[str, Any]:
    body = json.loads((DOCS / name).read_text())
    assert body["complete"], f"{name} is a partial run"
    return body


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    measured = _published("elastic-deadlines.json")
    interpolated = _published("elastic-deadlines.interpolated.json")
    subset = _published("elastic-deadlines.subset.json")
    out = [
        ("elastic-deadlines.json", r["policy"], r)
        for r in measured["runs"]
        if r["trace"] == "195job"
    ]
    out += [
        ("elastic-deadlines.interpolated.json", r["policy"], r)
        for r in interpolated["runs"]
        if r["trace"] == "195job" and r["policy"] == "dmug"
    ]
    out += [("elastic-deadlines.subset.json", r["policy"], r) for r in subset["runs"]]
    return out


CASES = _cases()


def test_the_subset_covers_every_policy_on_195job_and_2000_jobs_of_a_cluster_file() -> None:
    from bursar.sim.elastic.runner import VARIANTS

    on_195 = {p for f, p, r in CASES if f == "elastic-deadlines.json"}
    assert on_195 == {v.name for v in VARIANTS}
    (sub,) = [r for f, _, r in CASES if f == "elastic-deadlines.subset.json"]
    assert sub["trace"] == "cluster05" and sub["jobs"] == 2000
    # Every published run says which speed model produced it.
    for name in ("elastic-deadlines.json", "elastic-deadlines.interpolated.json"):
        models = {r["speed_model"] for r in _published(name)["runs"]}
        assert models == {"interpolated" if "interpolated" in name else "measured"}


@pytest.fixture(scope="module")
def curves():
    if not (ITP / "195job.csv.gz").is_file():
        pytest.skip(f"no ElasticFlow traces at {ITP} (set BURSAR_TRACES_DIR)")
    return load_curves(ITP / "throughputs_A100")


@pytest.mark.parametrize(
    ("source", "policy", "row"), CASES, ids=[f"{r['trace']}-{p}-{s}" for s, p, r in CASES]
)
def test_a_published_run_reproduces_its_hash(curves, source: str, policy: str, row: dict) -> None:
    conditions = _published(source)["conditions"]
    assert conditions["gpu_type"] == "A100"
    jobs = load_jobs(ITP / f"{row['trace']}.csv.gz")[: row["jobs"]]
    cluster = CLUSTERS[row["trace"]]
    assert str(cluster) == row["cluster"]
    r = run(
        jobs,
        curves,
        policy,
        cluster,
        trace_name=row["trace"],
        lease_term_s=conditions["lease_term_s"],
        speed_model=row["speed_model"],
        check="end",
    )
    assert r.sha256 == row["sha256"], (
        f"{row['trace']} under {policy} ({row['speed_model']}) no longer gives the hash "
        f"published in docs/{source}: regenerate the elastic results"
    )
    assert r.metrics["met"] == row["met"] and r.metrics["killed"] == 0
