"""Real ``sacct`` output round-trips through ingestion, replay and what-if: jobs run on the
accounting test cluster (``scripts/slurm-cluster.sh start --accounting``), are read back with
the documented ``sacct`` command, and go through ``bursar replay``, ``bursar fidelity`` and
``bursar whatif``.

The jobs: one that holds every node (exclusive) while the others queue behind it, one that
asks for every node too and is cancelled while it pends, one with an ``srun`` step, one with
GPUs, one that exits non-zero, a three-task array; two accounts. This test waits on a real
cluster (about 15 s)."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from slurm_support import Cluster, accounting_cluster_fixture  # noqa: F401  (fixture)

from bursar.cli.main import main
from bursar.sim.replay.accounting import SACCT_COMMAND
from bursar.testing import poll_until

pytestmark = pytest.mark.slow

CAPACITY = 4 * 32  # CPUs of the test cluster: 4 nodes x 32
WIDE_S = 5  # how long the exclusive job holds the whole cluster


def slurm(cluster: Cluster, *argv: str, check: bool = True) -> str:
    out = subprocess.run(list(argv), env=cluster.env(), capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"{shlex.join(argv)} exited {out.returncode}: {out.stderr}")
    return out.stdout


def sbatch(cluster: Cluster, name: str, account: str, wrap: str, *args: str) -> int:
    # --output: no slurm-N.out left in the directory the tests run from
    argv = ["sbatch", "--parsable", "--output=/dev/null", f"--job-name={name}"]
    out = slurm(cluster, *argv, f"--account={account}", *args, f"--wrap={wrap}")
    return int(out.strip().split(";")[0])


def state(cluster: Cluster, job: int) -> str:
    return slurm(cluster, "squeue", "-h", "-j", str(job), "-o", "%T", check=False).strip()


def bursar(*args: str) -> str:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def records(text: str) -> dict[str, dict[str, str]]:
    """sacct --parsable2 lines keyed by JobID (steps included)."""
    header, *rows = text.splitlines()
    names = header.split("|")
    parsed = [dict(zip(names, r.split("|"), strict=True)) for r in rows]
    return {r["JobID"]: r for r in parsed}


def test_sacct_output_round_trips(accounting_cluster: Cluster, tmp_path: Path) -> None:
    c = accounting_cluster
    # Accounts with root in both, so --account is kept rather than replaced by the default.
    slurm(c, "sacctmgr", "-i", "add", "account", "physics,chem", check=False)
    slurm(c, "sacctmgr", "-i", "add", "user", "root", "account=physics,chem", check=False)
    assocs = slurm(c, "sacctmgr", "-n", "-P", "list", "assoc", "user=root", "format=account")
    assert {"physics", "chem"} <= set(assocs.split())

    since = datetime.now().replace(microsecond=0)  # sacct's times are local, like this
    time.sleep(1)  # every job is submitted after `since`, to the second
    wide = sbatch(c, "wide", "physics", f"sleep {WIDE_S}", "-N4", "--exclusive", "-t2")
    # A real cluster: these jobs take real seconds.
    poll_until(lambda: state(c, wide), 30, "the exclusive job to run", ok=lambda s: s == "RUNNING")
    doomed = sbatch(c, "doomed", "chem", "sleep 1", "-N4", "--exclusive", "-t1")
    small = sbatch(c, "small", "chem", "srun sleep 2", "-n8", "-t1")
    gpus = sbatch(c, "gpus", "physics", "sleep 2", "-n4", "--gres=gpu:2", "-t5")
    fails = sbatch(c, "fails", "chem", "sleep 1; exit 3", "-n1", "-t1")
    sweep = sbatch(c, "sweep", "physics", "sleep 1", "--array=1-3", "-n2", "-t3")
    assert state(c, doomed) == "PENDING"  # behind the exclusive job
    slurm(c, "scancel", str(doomed))
    ours = [wide, doomed, small, gpus, fails, sweep]

    ids = ",".join(map(str, ours))

    def finished() -> bool:
        if slurm(c, "squeue", "-h", "-j", ids, check=False).strip():
            return False
        # The jobs' end records reach slurmdbd a little after the jobs end.
        ends = slurm(c, "sacct", "-n", "-X", "-P", "-j", ids, "--format=End").split()
        return len(ends) == 8 and "Unknown" not in ends

    poll_until(finished, 120, "every job to end and reach the accounting database", interval_s=0.5)

    # The documented command, as docs/trace-formats.md gives it, over this test's period.
    command = SACCT_COMMAND.replace("START", since.isoformat()).replace("END", "now")
    text = slurm(c, *shlex.split(command))
    trace = tmp_path / "cluster.sacct"
    trace.write_text(text)
    rec = records(text)
    jobs = {k: r for k, r in rec.items() if "." not in k}
    names = {str(wide): "wide", str(doomed): "doomed", str(small): "small", str(gpus): "gpus"}
    names |= {str(fails): "fails"} | {f"{sweep}_{i}": f"sweep_{i}" for i in (1, 2, 3)}
    assert set(jobs) == set(names), text  # the window holds this test's jobs only
    assert f"{small}.0" in rec and f"{wide}.batch" in rec  # steps, which ingestion skips
    by = {names[k]: r for k, r in jobs.items()}
    assert by["fails"]["State"] == "FAILED" and by["doomed"]["State"].startswith("CANCELLED")
    # Slurm 22.05 records the job cancelled while pending with Start = End (the cancel) and
    # no allocation: it never ran, and ingestion must not replay it as a 0 s job.
    assert by["doomed"]["AllocTRES"] == "" and by["doomed"]["Start"] == by["doomed"]["End"]
    assert "gres/gpu=2" in by["gpus"]["AllocTRES"]
    kept = {n: r for n, r in by.items() if n != "doomed"}

    # What sacct says each job waited and ran, and what the jobs were told to do.
    def wait(r: dict[str, str]) -> float:
        return _time(r["Start"]) - max(_time(r["Submit"]), _time(r["Eligible"]))

    def run(r: dict[str, str]) -> float:
        return _time(r["End"]) - _time(r["Start"])

    # (whole seconds, and a loaded machine starts and ends jobs a little late)
    assert WIDE_S <= run(kept["wide"]) <= WIDE_S + 3
    assert 2 <= run(kept["small"]) <= 5 and 2 <= run(kept["gpus"]) <= 5
    assert wait(kept["small"]) >= WIDE_S - 2  # it queued behind the exclusive job

    # Ingestion, through the CLI: 8 job records, 7 kept, the cancelled one dropped by name.
    out = tmp_path / "replay"
    cfg = tmp_path / "groups.toml"
    cfg.write_text('campaigns = "group"\n')
    common = ["--trace", str(trace), "--format", "sacct", "--capacity", str(CAPACITY)]
    printed = bursar("replay", *common, "--policy", "fifo", "--config", str(cfg), "--out", str(out))
    assert "cancelled before it started (no AllocTRES)" in printed
    m = json.loads((out / "metrics.json").read_text())
    assert m["quality"]["records"] == 8 and m["quality"]["kept"] == 7
    assert m["quality"]["dropped"] == {"cancelled before it started (no AllocTRES)": 1}
    assert m["jobs"] == 7
    assert {n: v["jobs"] for n, v in m["campaigns"].items()} == {
        "group-physics": 5,  # wide, gpus, three sweep tasks
        "group-chem": 2,  # small, fails
    }
    # Every job holds its CPUs for the runtime sacct recorded; and in the replay, as on the
    # cluster, nothing starts beside the job that took every CPU.
    ids = {r["JobIDRaw"]: n for n, r in kept.items()}
    rows = [ln.split(",") for ln in (out / "schedule.csv").read_text().splitlines()[1:]]
    sched = {ids[r[0]]: (float(r[3]), float(r[4]), int(r[5])) for r in rows}
    assert {n: e - s for n, (s, e, _) in sched.items()} == {n: run(r) for n, r in kept.items()}
    assert sched["wide"][2] == CAPACITY and sched["small"][2] == 8
    assert sched["small"][0] >= sched["wide"][1]

    # The recorded waits the fidelity gate compares with: sacct's, job for job.
    f = json.loads(bursar("fidelity", *common, "--policy", "fifo", "--json"))
    assert f["measures"]["jobs"] == 7
    waits = [wait(r) for r in kept.values()]
    assert f["measures"]["mean_wait_obs"] == pytest.approx(sum(waits) / len(waits))

    # What-if: twice the CPUs lets the queued jobs start beside the exclusive one.
    wdir = tmp_path / "whatif"
    bigger = f"capacity={2 * CAPACITY}"
    cands = ["--candidate", bigger, "--candidate", "policy=easy"]
    bursar("whatif", *common, "--config", str(cfg), "--policy", "fifo", *cands, "--out", str(wdir))
    d = json.loads((wdir / "whatif.json").read_text())
    assert d["baseline"]["jobs"] == 7
    verdicts = {k["label"]: k["verdict"] for k in d["candidates"]}
    assert set(verdicts) == {bigger, "policy=easy"}
    assert set(verdicts.values()) <= {"accepted", "rejected"}
    more = next(k for k in d["candidates"] if k["label"] == bigger)
    assert more["mean_wait_s"] == 0 < d["baseline"]["mean_wait_s"]
    assert "recorded" in d["fidelity"]
    assert (wdir / "whatif.md").is_file()
