"""The power model: node idle and peak from node-day measurements, a job's draw, Zeus's
GPU power and the slowdown of a power limit, and a facility's draw over a schedule."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest

from bursar.sim.power.model import (
    QUANTILES,
    NodePower,
    facility_draw,
    job_quantile,
    job_watts,
    node_power,
    percentile,
)
from bursar.sim.power.readers import read_m100_node_power, read_zeus, read_zeus_profiles
from bursar.sim.replay.table import TraceError

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
M100 = TRACES / "m100-node-power-daily" / "cov_all.csv.gz"
ZEUS_V100 = TRACES / "zeus-gpu-power" / "summary_power_v100.csv.gz"

M100_HEADER = (
    "node,day,ambient_mean,ambient_max,ambient_n,total_power_mean,total_power_max,total_power_n\n"
)
ZEUS_HEADER = "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n"


def _m100(tmp_path: Path, rows: list[str], gz: bool = True) -> Path:
    text = M100_HEADER + "".join(r + "\n" for r in rows)
    p = tmp_path / ("cov.csv.gz" if gz else "cov.csv")
    p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return p


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0], 99) == 10.0
    with pytest.raises(ValueError):
        percentile([], 1)


def test_node_power_from_node_days_skips_empty_and_zero_readings(tmp_path: Path) -> None:
    rows = [f"{n},2020-05-01,20,25,4320,{300 + 10 * n},{1000 + 10 * n},4320" for n in range(100)]
    rows.append("100,2020-05-01,,,0,,,0")  # no sample that day
    rows.append("101,2020-05-01,20,25,4320,0,0,4320")  # a sensor fault
    node = read_m100_node_power(_m100(tmp_path, rows))
    assert node.samples == 100
    # The 1st percentile of the means 300..1290 and the 99th of the maxima 1000..1990.
    assert node.idle_w == pytest.approx(300 + 0.99 * 10)
    assert node.peak_w == pytest.approx(1000 + 98.01 * 10)
    assert len(node.loaded_w) == QUANTILES + 1
    assert node.loaded(0.0) == node.idle_w  # never below idle
    assert node.loaded(0.5) == pytest.approx(795.0)
    assert "Marconi100" in node.source


def test_a_bad_node_day_row_names_the_file_and_line(tmp_path: Path) -> None:
    p = _m100(
        tmp_path, ["0,2020-05-01,20,25,4320,500,1200,4320", "1,2020-05-01,20,25,4320,lots,1,1"]
    )
    with pytest.raises(TraceError, match=r"cov.csv.gz:3: total_power_mean is not a number"):
        read_m100_node_power(p)
    missing = tmp_path / "bad.csv"
    missing.write_text("node,day,total_power_mean\n0,2020-05-01,500\n")
    with pytest.raises(TraceError, match=r"missing column.*total_power_max"):
        read_m100_node_power(missing)
    with pytest.raises(TraceError, match="no such file"):
        read_m100_node_power(tmp_path / "absent.csv.gz")


def test_node_power_refuses_idle_above_peak() -> None:
    with pytest.raises(ValueError, match="idle <= peak"):
        NodePower("x", 500.0, 400.0, tuple(float(i) for i in range(QUANTILES + 1)), "test")


def test_a_jobs_draw_is_fixed_by_its_id_and_scales_with_its_nodes() -> None:
    node = node_power("n", [float(300 + i) for i in range(1000)], [2000.0] * 10, "test")
    assert job_quantile(7) == job_quantile(7)
    assert 0 <= job_quantile(7) < 1
    assert job_quantile(7) != job_quantile(8)
    one = job_watts(node, 7, 1)
    assert node.idle_w <= one <= node.peak_w + 1
    assert job_watts(node, 7, 4) == math.ceil(4 * node.loaded(job_quantile(7)))


def test_zeus_profile_is_the_median_slowdown_against_each_configs_top_limit(
    tmp_path: Path,
) -> None:
    p = tmp_path / "summary_power_v100.csv"
    p.write_text(
        ZEUS_HEADER
        + "imagenet,resnet50,64,adam,100,20,90\n"
        + "imagenet,resnet50,64,adam,250,10,220\n"
        + "imagenet,resnet50,128,adam,100,30,100\n"
        + "imagenet,resnet50,128,adam,250,20,230\n"
    )
    prof = read_zeus_profiles(p)["resnet50"]
    assert prof.gpu == "v100"
    assert prof.limits == (100, 250)
    assert prof.slowdown == (pytest.approx(1.75), 1.0)  # median of 2.0 and 1.5
    assert prof.watts == (95.0, 225.0)
    assert prof.at(249) == (95.0, pytest.approx(1.75))  # runs as the lower measured limit
    assert prof.at(300) == (225.0, 1.0)
    with pytest.raises(ValueError, match="no measurement at or below 99 W"):
        prof.at(99)


def test_a_bad_zeus_row_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "summary_power_a40.csv"
    p.write_text(ZEUS_HEADER + "imagenet,resnet50,64,adam,100,0,90\n")
    with pytest.raises(TraceError, match=r"summary_power_a40.csv:2: time_per_epoch must be > 0"):
        read_zeus(p)
    q = tmp_path / "power.csv"
    q.write_text(ZEUS_HEADER + "imagenet,resnet50,64,adam,100,1,90\n")
    with pytest.raises(TraceError, match="not a Zeus power file"):
        read_zeus_profiles(q)


def test_facility_draw_energy_peak_and_time_above_each_cap() -> None:
    nan = math.nan
    # Idle 100 W; job 0 draws 50 W more over [0, 10), job 1 30 W over [5, 20); job 2 never ran.
    d = facility_draw([0.0, 5.0, nan], [10.0, 20.0, nan], [50.0, 30.0, 999.0], 100.0, [140, 170])
    assert d.peak_w == 180.0
    assert d.energy_j == pytest.approx(100 * 20 + 50 * 10 + 30 * 15)
    assert d.above_s == {140: 10.0, 170: 5.0}
    # An end and a start at one instant: the end first, no false peak.
    d = facility_draw([0.0, 10.0], [10.0, 20.0], [50.0, 50.0], 0.0)
    assert d.peak_w == 50.0


@pytest.mark.skipif(not M100.is_file(), reason=f"the Marconi100 node-day table is not at {M100}")
def test_marconi100_node_power_from_the_real_table() -> None:
    node = read_m100_node_power(M100)
    assert node.samples == 835_647  # node-days with power above 0 W
    assert 360 < node.idle_w < 380  # the README: idle floor about 0.3-0.4 kW
    assert 1800 < node.peak_w < 1900
    assert 640 < node.loaded(0.5) < 660  # the median node-day mean, 650 W


@pytest.mark.skipif(
    not ZEUS_V100.is_file(), reason=f"the Zeus V100 profiles are not at {ZEUS_V100}"
)
def test_zeus_v100_profiles_from_the_real_file() -> None:
    profs = read_zeus_profiles(ZEUS_V100)
    assert {"resnet50", "bert_base_uncased", "deepspeech2"} <= set(profs)
    r = profs["resnet50"]
    assert r.limits == (100, 125, 150, 175, 200, 225, 250)
    assert r.slowdown[-1] == 1.0
    assert 1.7 < r.slowdown[0] < 2.0  # resnet50 at 100 W: about 1.8 times as long
    assert list(r.watts) == sorted(r.watts)
