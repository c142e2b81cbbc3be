"""examples/dask_bursar_cluster.py: the same workload on a LocalCluster and on a
BursarCluster (leases from a broker over gRPC) gives the same results; and BursarCluster
passes dask-jobqueue's own check of the missing cores/memory message.

The example against a running ``bursar serve`` is tests/project/test_examples.py's."""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from pathlib import Path

import pytest

from bursar.providers.dask import BursarCluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dask_bursar_cluster.py"


@pytest.mark.slow
def test_the_example_runs_on_both_clusters(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("dask_bursar_cluster", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # Each cluster is made by one statement; the workload is shared.
    for fn in (mod.local_cluster, mod.bursar_cluster):
        body = [ln for ln in inspect.getsource(fn).splitlines()[1:] if ln.strip()]
        assert len(body) == 1 and body[0].strip().startswith("return "), body
    assert mod.main(["--in-process"]) == 0
    out = capsys.readouterr().out
    assert "LocalCluster:" in out and "BursarCluster:" in out and "same results" in out


def test_bursar_cluster_meets_dask_jobqueues_cores_and_memory_check() -> None:
    # dask-jobqueue's own test, as it runs for every cluster class it ships: the example in
    # the message is one its users can paste. Its module declares marks that only its own
    # test suite registers.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        from dask_jobqueue.tests import test_jobqueue_core

    test_jobqueue_core.test_cluster_has_cores_and_memory(BursarCluster)
