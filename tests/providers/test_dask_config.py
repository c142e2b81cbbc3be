"""BursarJob's script and the jobqueue.bursar settings: defaults from the shipped
bursar.yaml and the dask config, and errors that name the key, its source and what is
allowed. No broker or worker is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import pytest

from bursar.providers.dask import BursarCluster, BursarJob, ConfigError
from bursar.providers.dask.config import DEFAULTS, source_of, walltime_s
from bursar.providers.dask.job import JobOfWorker, LeaseSession, worker_job

SCHED = "tcp://127.0.0.1:8786"


def job(**kw: Any) -> BursarJob:
    kw.setdefault("cores", 4)
    kw.setdefault("memory", "8GB")
    return BursarJob(SCHED, name="c-3", session=LeaseSession("h:1", "sci", None), **kw)


def test_job_script_is_the_jobqueue_script_with_a_lease_header() -> None:
    j = job(
        processes=2,
        gpus=2,
        walltime="01:00:00",
        lease_class="opportunistic",
        job_script_prologue=["export A=1", "module load cuda"],
        worker_extra_args=["--no-dashboard"],
        job_extra_directives=["team=astro"],
        python="/opt/py/bin/python",
    )
    assert j.job_script() == (
        "#!/usr/bin/env bash\n\n"
        "# bursar-lease: broker=h:1 campaign=sci\n"
        "# bursar-lease: size cpu=4 mem_gb=8 gpu=2\n"
        "# bursar-lease: duration=3600s class=opportunistic\n"
        "# bursar-job: name=dask-worker\n"
        "# bursar-lease: label team=astro\n"
        "export A=1\nmodule load cuda\n"
        f"/opt/py/bin/python -m distributed.cli.dask_worker {SCHED} --name c-3 --nthreads 2 "
        "--memory-limit 3.73GiB --nworkers 2 --nanny --death-timeout 60 --no-dashboard "
        "--resources GPU=1\n"
    )
    assert j.lease_size == {"cpu": 4.0, "mem_gb": 8.0, "gpu": 2.0}
    assert j.duration_s == 3600.0
    assert j.labels == {"engine": "dask", "dask_job": "c-3", "team": "astro"}
    assert j.worker_names == ["c-3-0", "c-3-1"]
    # job_directives_skip drops header lines, as in dask-jobqueue.
    assert (
        "label" not in job(job_extra_directives=["x=1"], job_directives_skip=["label"]).job_header
    )


def test_defaults_come_from_the_shipped_yaml_and_the_dask_config() -> None:
    assert DEFAULTS.is_file()
    assert dask.config.get("jobqueue.bursar.walltime") == "00:30:00"
    j = job()
    assert j.duration_s == 1800 and j.gpus == 0 and "gpu" not in j.lease_size
    assert j.worker_processes == 4  # dask-jobqueue's default split of 4 cores
    with dask.config.set(
        {
            "jobqueue.bursar.cores": 3,
            "jobqueue.bursar.memory": "3GB",
            "jobqueue.bursar.walltime": "05:00",
            "jobqueue.bursar.gpus": 1,
            "jobqueue.bursar.processes": 1,
        }
    ):
        j = BursarJob(SCHED, name="x", session=LeaseSession("h:1", None, None))
        assert j.lease_size == {"cpu": 3.0, "mem_gb": 3.0, "gpu": 1.0}
        assert j.duration_s == 300 and "--resources GPU=1" in j.job_script()


@pytest.mark.parametrize(
    ("kw", "key", "allowed"),
    [
        ({"walltime": "an hour"}, "walltime", '"HH:MM:SS"'),
        ({"walltime": -5}, "walltime", '"HH:MM:SS"'),
        ({"processes": 5}, "processes", "an integer from 1 to cores (4)"),
        ({"cores": 0}, "cores", "an integer >= 1"),
        ({"memory": "lots"}, "memory", '"4GiB"'),
        ({"gpus": -1}, "gpus", "an integer >= 0"),
        ({"gpus": 3, "processes": 2}, "gpus", "a multiple of processes (2)"),
        ({"lease_class": "vip"}, "lease-class", "interactive, batch, opportunistic"),
        ({"lease_margin": 900, "walltime": 600}, "lease-margin", "under half the walltime"),
        ({"retry_interval": (2, 1)}, "retry-interval", "0 < min_s <= max_s"),
        ({"elastic": 4}, "elastic", "a mapping of min, max, work, deadline"),
        ({"elastic": {"max": 4, "work": 60}}, "elastic", "a mapping of min, max"),
        ({"elastic": {"max": 4, "work": 60, "deadline": 9, "speed": 2}}, "elastic", "min, max"),
        ({"elastic": {"min": 3, "max": 2, "work": 60, "deadline": 9}}, "elastic", "1 <= min"),
        ({"elastic": {"max": 2, "work": 60, "deadline": 9, "amdahl": 2}}, "elastic", "amdahl"),
    ],
)
def test_a_bad_argument_names_the_key_and_what_is_allowed(
    kw: dict[str, Any], key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as err:
        job(**kw)
    msg = str(err.value)
    assert f"jobqueue.bursar.{key} = " in msg and allowed in msg
    assert "BursarCluster(" in msg  # where the value came from


def test_a_bad_config_value_names_where_it_was_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with dask.config.set({"jobqueue.bursar.walltime": "soon"}), pytest.raises(ConfigError) as err:
        job()
    assert "jobqueue.bursar.walltime = 'soon' (from the dask config" in str(err.value)

    (tmp_path / "site.yaml").write_text("jobqueue:\n  bursar:\n    walltime: soon\n")
    assert (
        source_of("walltime", [str(tmp_path)]) == f"the dask config file {tmp_path / 'site.yaml'}"
    )
    assert source_of("gpus", [str(tmp_path)]).startswith("the dask config (")
    monkeypatch.setenv("DASK_JOBQUEUE__BURSAR__LEASE_MARGIN", "3")
    assert source_of("lease-margin", [str(tmp_path)]) == (
        "the environment variable DASK_JOBQUEUE__BURSAR__LEASE_MARGIN"
    )


def test_cores_and_memory_are_required() -> None:
    with pytest.raises(
        ConfigError, match=r"(?s)how much cores and memory .*jobqueue\.bursar\.cores"
    ):
        BursarJob(SCHED, name="x", session=LeaseSession("h:1", None, None))


def test_missing_cores_says_so_in_dask_jobqueues_words_and_echoes_what_was_given() -> None:
    with pytest.raises(ConfigError) as info:
        BursarCluster(memory="4GB", broker="h:1")
    first, example, given = str(info.value).splitlines()
    # dask-jobqueue's message, word for word, so that its users recognise it.
    assert first == (
        "You must specify how much cores and memory per job you want to use, for example:"
    )
    assert example == "cluster = BursarCluster(cores=8, memory='4GB')"  # what was given kept
    assert given.startswith("given: cores=None, memory='4GB' ")
    assert given.endswith("set jobqueue.bursar.cores in a dask config file")
    with pytest.raises(ConfigError, match=r"(?s)given: cores=2, memory=None .*bursar\.memory in"):
        BursarCluster(cores=2, broker="h:1")


def test_a_bad_cluster_argument_fails_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r'jobqueue.bursar.broker = .*allowed: "host:port"'):
        BursarCluster(cores=1, memory="1GB", broker="nowhere")
    with pytest.raises(ValueError, match="unexpected keyword argument"):
        BursarCluster(cores=1, memory="1GB", broker="h:1", cpus=4)
    with pytest.raises(ConfigError, match="walltime"):
        BursarCluster(cores=1, memory="1GB", broker="h:1", walltime="x")


def test_walltime_and_worker_grouping() -> None:
    assert walltime_s("01:02:03") == 3723 and walltime_s("10:00") == 600
    assert walltime_s(90) == 90 and walltime_s("45") == 45
    for bad in ("", "1:2:3:4", "0", True):
        with pytest.raises(ValueError):
            walltime_s(bad)  # type: ignore[arg-type]
    assert worker_job("c-3-1", 2) == "c-3" and worker_job("c-3", 1) == "c-3"
    # An elastic job's unit k > 0 adds -u<k> to the job's name.
    assert worker_job("c-3-u2", 1) == "c-3" and worker_job("c-3-u2-1", 2) == "c-3"

    class WS:
        name = "cl-12-0"

    assert JobOfWorker(2)(WS()) == "cl-12"


def test_an_elastic_job_asks_for_units_of_its_size() -> None:
    j = job(
        processes=2,
        elastic={"min": 1, "max": 3, "work": 600, "deadline": "00:20:00", "amdahl": 0.1},
    )
    assert "# bursar-lease: elastic min=1 max=3 units of the size above" in j.job_script()
    intent = j.intent()
    assert intent.min == {"cpu": 4.0, "mem_gb": 8.0} and intent.step == intent.min
    assert intent.max == {"cpu": 12.0, "mem_gb": 24.0}
    assert (intent.work, intent.deadline_s, intent.amdahl) == (600.0, 1200.0, 0.1)
    assert j.units_in({"cpu": 8.0, "mem_gb": 8.0}) == 1  # whole units of every dimension
    assert j.units_in({"cpu": 12.0, "mem_gb": 24.0}) == 3
    assert j.unit_worker_names(2) == ["c-3-u2-0", "c-3-u2-1"]
    with dask.config.set({"jobqueue.bursar.elastic": {"max": 2, "work": 5, "deadline": 60}}):
        assert job().elastic is not None and job().elastic.min == 1  # type: ignore[union-attr]
    assert job().elastic is None
