"""examples/dask_bursar_cluster.py: the same workload on a LocalCluster and on a
BursarCluster (leases from a broker over gRPC) gives the same results."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dask_bursar_cluster.py"


def test_the_example_runs_on_both_clusters(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("dask_bursar_cluster", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # Each cluster is made by one statement; the workload is shared.
    for fn in (mod.local_cluster, mod.bursar_cluster):
        body = [ln for ln in inspect.getsource(fn).splitlines()[1:] if ln.strip()]
        assert len(body) == 1 and body[0].strip().startswith("return "), body
    assert mod.main([]) == 0
    out = capsys.readouterr().out
    assert "LocalCluster:" in out and "BursarCluster:" in out and "same results" in out
