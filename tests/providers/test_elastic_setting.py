"""The workflow plugins' ``elastic`` setting (``providers/elastic.py``) names the sizes a
block can use (``sizes``, ``size_rule``) and how a measured curve is read
(``speed_model``), as the broker's intent does: the broker is sent them in units of the
intent's speedup dimension, and bad values are refused when the plugin is configured,
naming the setting and what it allows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_support import ServerThread, server_thread, until
from elastic_support import elastic_config
from parsl.launchers import SimpleLauncher

from bursar.providers.client import Backoff, BrokerClient
from bursar.providers.dask.config import elastic_setting
from bursar.providers.elastic import Elastic
from bursar.providers.parsl import BursarProvider
from bursar.providers.ray.settings import SettingsError, node_settings

BASE = {"max": 8, "work": 600, "deadline": 3000}


def test_sizes_and_size_rule_are_sent_in_units_of_the_speedup_dimension() -> None:
    e = Elastic.parse({**BASE, "size_rule": "powers_of_two"})
    assert e.counts == (1, 2, 4, 8)
    # A unit of 2 cores and 4 GB: the sizes count cores (the speedup dimension).
    it = e.intent({"cpu": 2, "mem_gb": 4})
    assert tuple(it.sizes) == (2, 4, 8, 16) and it.size_rule == ""
    both = Elastic.parse({**BASE, "min": 2, "sizes": [2, 3, 6, 8], "size_rule": "divisors_of:24"})
    assert both.counts == (2, 3, 6, 8)
    assert Elastic.parse(BASE).intent({"cpu": 1}).sizes == ()  # every count from min to max
    # A measured curve, read as speed_model says, instead of Amdahl's law.
    curved = Elastic.parse(
        {**BASE, "curve": [[1, 10], [2, 19], [8, 60]], "speed_model": "interpolated"}
    )
    it = curved.intent({"gpu": 1, "cpu": 4})
    assert it.amdahl is None and tuple(it.curve) == ((1, 10.0), (2, 19.0), (8, 60.0))
    assert it.speed_model == "interpolated"
    assert Elastic.parse(BASE).intent({"cpu": 1}).speed_model == "measured"


BAD = [
    ({"size_rule": "odd"}, "size_rule 'odd'"),
    ({"size_rule": "divisors_of:x"}, "the batch B"),
    ({"speed_model": "guess"}, "speed_model 'guess'"),
    ({"sizes": [2, 4]}, "min \\(1 units\\) is not among"),
    ({"sizes": [1, 9]}, "outside min to max"),
    ({"sizes": "1,2"}, "sizes must be a list"),
    ({"curve": [[2, 1.0], [8, 3.0]]}, "must cover min to max"),
    ({"curve": [[1, 1.0], [8, 3.0]], "amdahl": 0.1}, "amdahl or curve"),
]


@pytest.mark.parametrize(("extra", "why"), BAD, ids=[w for _, w in BAD])
def test_each_plugin_refuses_a_bad_value_naming_the_setting_and_what_it_allows(
    extra: dict[str, object], why: str
) -> None:
    value = {**BASE, **extra}
    with pytest.raises(ValueError, match=why) as parsl_err:
        BursarProvider(broker="x", elastic=value)
    assert "elastic must be" in str(parsl_err.value) and "size_rule" in str(parsl_err.value)
    with pytest.raises(ValueError, match=why) as dask_err:
        elastic_setting(value, "test.yaml")
    assert "elastic" in str(dask_err.value) and "powers_of_two" in str(dask_err.value)
    with pytest.raises(SettingsError, match=why) as ray_err:
        node_settings("worker", {"elastic": value})
    assert "elastic" in str(ray_err.value) and "speed_model" in str(ray_err.value)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state", cfg=elastic_config()) as s:
        yield s


@pytest.mark.slow
def test_a_parsl_block_grows_only_to_the_sizes_its_setting_allows(
    server: ServerThread, tmp_path: Path
) -> None:
    # Four free cores and a max of 4 one-core units: without sizes the block would grow to
    # 4; with sizes [1, 3] the broker grows it to 3 and no further.
    p = BursarProvider(
        broker=server.address,
        campaign="el",
        token=server.tokens["el"],
        launcher=SimpleLauncher(),
        backoff=Backoff(initial_s=0.05, max_s=0.3),
        resources_per_block={"cpu": 1},
        elastic={"max": 4, "work": 5000, "deadline": 3000, "amdahl": 0.05, "sizes": [1, 3]},
    )
    p.script_dir = str(tmp_path / "scripts")
    try:
        job = p.submit("sleep 60", 1, "parsl.t.block-0")
        with BrokerClient(server.address, server.tokens["el"]) as c:

            def cores() -> float:
                (lease,) = c.list_leases()
                return lease.size.get("cpu", 0.0)

            until(lambda: p.lease_id(job) is not None and c.list_leases(), what="a lease")
            until(lambda: cores() == 3.0, what="grown to 3 cores")
            time.sleep(1.0)  # a later pass would have grown it further, were 4 allowed
            assert cores() == 3.0
        assert p.cancel([job]) == [True]
    finally:
        p.close()
