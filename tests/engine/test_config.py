"""Config files: the packaged demo, TOML/YAML equivalence, and one error per kind of mistake."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
import yaml

from bursar.broker import dims
from bursar.broker.config import (
    Config,
    default_config,
    default_config_text,
    file_backend,
    load_config,
    parse_config,
    pool_capacity,
)
from bursar.broker.envelope import DimEnvelope, LeaseClass
from bursar.broker.errors import ConfigError
from bursar.broker.policy import Enforcement, NodeGroup, PolicySpec, PoolSpec

BASE_TOML = """\
[pool]
boot_latency_s = 30
[pool.rate_capacity]
inference = 100
[pool.groups.node]
count = 4
warm = 2
gpu = 4
cpu = 16
mem_gb = 64

[policy]
grace_s = 10
enforcement = "prepaid"
[policy.warm_headroom]
gpu = 4

[campaigns.storm]
class = "batch"
[campaigns.storm.gpu]
guarantee = 4
sustained = 4
burst = 8
bucket = 1000
[campaigns.storm.inference]
guarantee = 10
sustained = 20.5
burst = 40

[campaigns.fill]
class = "opportunistic"
preemptible = true
[campaigns.fill.gpu]
sustained = 16
burst = 16
bucket = "unlimited"
"""

BASE_YAML = """\
pool:
  boot_latency_s: 30
  rate_capacity: {inference: 100}
  groups:
    node: {count: 4, warm: 2, gpu: 4, cpu: 16, mem_gb: 64}
policy:
  grace_s: 10
  enforcement: prepaid
  warm_headroom: {gpu: 4}
campaigns:
  storm:
    class: batch
    gpu: {guarantee: 4, sustained: 4, burst: 8, bucket: 1000}
    inference: {guarantee: 10, sustained: 20.5, burst: 40}
  fill:
    class: opportunistic
    preemptible: true
    gpu: {sustained: 16, burst: 16}   # bucket left out: unlimited
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# --- the packaged demo ------------------------------------------------------------------


def test_default_config_is_the_design_demo_pool() -> None:
    cfg = default_config()
    assert isinstance(cfg, Config)
    assert len(cfg.pool.node_names()) == 64
    cap = pool_capacity(cfg.pool)
    assert cap["gpu"] == 512
    assert cap["cpu"] == 64 * 64
    assert cap["mem_gb"] == 64 * 512
    assert cap["fs_bw"] > 0 and cap["inference"] > 0
    assert cfg.pool.boot_latency_s == 60
    assert cfg.policy.grace_s == 30
    assert cfg.policy.warm_headroom == {"gpu": 32}
    assert cfg.policy.enforcement is Enforcement.PREPAID

    by_name = {c.name: c for c in cfg.campaigns}
    expected = {  # the flagship pool: guarantee / R / burst / B (GPU-s)
        "victim": (LeaseClass.INTERACTIVE, False, DimEnvelope(32, 32, 64, 60_000)),
        "adaptive-sci": (LeaseClass.BATCH, False, DimEnvelope(64, 128, 384, 300_000)),
        "naive-sci": (LeaseClass.BATCH, False, DimEnvelope(64, 128, 384, 300_000)),
        "storm": (LeaseClass.BATCH, False, DimEnvelope(16, 64, 384, 150_000)),
        "backfill": (LeaseClass.OPPORTUNISTIC, True, DimEnvelope(0, 512, 512, None)),
    }
    assert list(by_name) == list(expected)
    for name, (cls, preemptible, gpu) in expected.items():
        spec = by_name[name]
        assert spec.lease_class is cls
        assert spec.preemptible is preemptible
        assert spec.envelope("gpu") == gpu
        assert set(spec.envelopes) == set(dims.ALL)
        # cpu and memory in node proportion: 8 cores and 64 GB per GPU.
        for d, per_gpu in (("cpu", 8), ("mem_gb", 64)):
            env = spec.envelopes[d]
            assert env.guarantee == gpu.guarantee * per_gpu
            assert env.sustained == gpu.sustained * per_gpu
            assert env.burst == gpu.burst * per_gpu
            assert env.bucket == (None if gpu.bucket is None else gpu.bucket * per_gpu)
        assert spec.problems() == []

    storm_inf = by_name["storm"].envelopes["inference"]
    assert (storm_inf.sustained, storm_inf.burst) == (50, 200)

    # Warm at start: enough for every guarantee plus the headroom.
    (group,) = cfg.pool.groups
    guarantees = sum(c.envelopes["gpu"].guarantee for c in cfg.campaigns)
    assert group.warm * group.resources["gpu"] >= guarantees + cfg.policy.warm_headroom["gpu"]


def test_default_text_loads_from_a_file_to_the_same_config(tmp_path: Path) -> None:
    p = _write(tmp_path, "copy.toml", default_config_text())
    assert load_config(p) == default_config()


def test_demo_documents_every_key() -> None:
    # The demo is the reference for the format: every key the schema knows appears in it
    # (set or commented out) at least once, next to its comment.
    text = default_config_text()
    for name in (f.name for f in dataclasses.fields(PolicySpec)):
        assert f"{name} = " in text or f"[policy.{name}]" in text, name
    for key in (
        "boot_latency_s",
        "count",
        "warm",
        "prefix",
        "idle_w",
        "peak_w",
        "class",
        "preemptible",
        "guarantee",
        "sustained",
        "burst",
        "bucket",
    ):
        assert f"{key} = " in text, key


def test_every_policy_field_is_a_config_key(tmp_path: Path) -> None:
    # Guards against PolicySpec growing a field the config cannot set.
    overrides = {
        "grace_s": 7.0,
        "warm_headroom": {"gpu": 2.0},
        "enforcement": "grant_instant",
        "hol_patience_s": 11.0,
        "max_lease_s": 3600.0,
        "min_retry_s": 2.0,
        "price_base": 3.0,
        "price_k": 0.5,
        "meter_window_s": 5.0,
        "power_down_idle_s": 120.0,
        "reservations": 3,
        "fairshare_half_life_s": 3600.0,
        "renewals_push_reservations": True,
        "elastic_rule": "edf",
        "elastic_risk": False,
        "elastic_degrade": False,
        "elastic_admission": False,
        "elastic_hysteresis": 3.0,
        "idempotency_window_s": 600.0,
        "idempotency_keys_kept": 5000,
        "ended_leases_kept": 700,
        "power_cap_w": 1.0e6,
    }
    assert set(overrides) == {f.name for f in dataclasses.fields(PolicySpec)}
    data = tomllib.loads(BASE_TOML)
    data["policy"] = overrides
    p = _write(tmp_path, "c.yaml", yaml.safe_dump(data))
    policy = load_config(p).policy
    assert policy.enforcement is Enforcement.GRANT_INSTANT
    for k, v in overrides.items():
        if k not in ("enforcement",):
            assert getattr(policy, k) == v, k


def test_fairshare_off_and_bad_values_are_explained(tmp_path: Path) -> None:
    data = tomllib.loads(BASE_TOML)
    data["policy"] = {"fairshare_half_life_s": "off"}
    assert (
        load_config(_write(tmp_path, "a.yaml", yaml.safe_dump(data))).policy.fairshare_half_life_s
        is None
    )
    data["policy"] = {"fairshare_half_life_s": "weekly"}
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "b.yaml", yaml.safe_dump(data)))
    assert "policy.fairshare_half_life_s" in str(err.value) and '"off"' in str(err.value)
    data["policy"] = {"reservations": 0}
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "c.yaml", yaml.safe_dump(data)))
    assert "policy.reservations" in str(err.value)
    # Zero would look at a node still needed for the reserve again at the same instant.
    data["policy"] = {"power_down_idle_s": 0}
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "d.yaml", yaml.safe_dump(data)))
    assert "policy.power_down_idle_s" in str(err.value) and "allowed: numbers > 0" in str(err.value)


def test_policy_defaults_come_from_policyspec() -> None:
    data = tomllib.loads(BASE_TOML)
    del data["policy"]
    cfg = parse_config(yaml.safe_dump(data), "yaml")
    assert cfg.policy == PolicySpec()
    assert cfg.pool.boot_latency_s == 30


# --- TOML and YAML ----------------------------------------------------------------------


def test_toml_and_yaml_give_equal_configs(tmp_path: Path) -> None:
    from_toml = load_config(_write(tmp_path, "c.toml", BASE_TOML))
    from_yaml = load_config(_write(tmp_path, "c.yaml", BASE_YAML))
    from_yml = load_config(_write(tmp_path, "c.yml", BASE_YAML))
    assert from_toml == from_yaml == from_yml
    fill = {c.name: c for c in from_toml.campaigns}["fill"]
    assert fill.envelope("gpu") == DimEnvelope(0, 16, 16, None)
    assert [n for n, _, warm in from_toml.pool.node_names() if warm] == ["node000", "node001"]


def test_demo_as_yaml_equals_demo(tmp_path: Path) -> None:
    data = tomllib.loads(default_config_text())
    p = _write(tmp_path, "demo.yaml", yaml.safe_dump(data, sort_keys=False))
    assert load_config(p) == default_config()


def test_group_prefix_and_several_groups() -> None:
    data = tomllib.loads(BASE_TOML)
    data["pool"]["groups"]["cpu"] = {"count": 2, "cpu": 128, "mem_gb": 256, "prefix": "c"}
    cfg = parse_config(yaml.safe_dump(data, sort_keys=False), "yaml")
    names = [n for n, _, _ in cfg.pool.node_names()]
    assert names == ["node000", "node001", "node002", "node003", "c000", "c001"]
    assert pool_capacity(cfg.pool)["cpu"] == 4 * 16 + 2 * 128


# --- one error per kind of mistake ------------------------------------------------------


def _edit(old: str, new: str, base: str = BASE_TOML) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


_YAML_POLICY = "policy:\n  grace_s: 10\n  enforcement: prepaid\n  warm_headroom: {gpu: 4}\n"
_GPU_ENV = "guarantee = 4\nsustained = 4\nburst = 8"

# (id, file name, file text or None for "do not create", expected key, fragments in str(e))
# fmt: off
BAD = [
    ("unknown-key", "c.toml", _edit("burst = 8", "burts = 8"),
     "campaigns.storm.gpu.burts",
     ["unknown key 'burts'", "allowed: guarantee, sustained, burst, bucket"]),
    ("unknown-section", "c.toml", _edit("[policy]\n", "[polcy]\n"),
     "polcy", ["unknown key", "allowed: pool, policy, campaigns"]),
    ("wrong-type-count", "c.toml", _edit("count = 4", 'count = "four"'),
     "pool.groups.node.count", ["expected a whole number", "'four'"]),
    ("wrong-type-float-count", "c.toml", _edit("count = 4", "count = 4.5"),
     "pool.groups.node.count", ["expected a whole number"]),
    ("wrong-type-number", "c.toml", _edit("grace_s = 10", 'grace_s = "10"'),
     "policy.grace_s", ["expected a number"]),
    ("wrong-type-yaml-exponent", "c.yaml", _edit("burst: 8,", "burst: 8e3,", BASE_YAML),
     "campaigns.storm.gpu.burst", ["expected a number", "3.0e+5"]),
    ("wrong-type-bool", "c.yaml", _edit("preemptible: true", "preemptible: 'yes'", BASE_YAML),
     "campaigns.fill.preemptible", ["expected true or false"]),
    ("wrong-type-table", "c.yaml", _edit(_YAML_POLICY, "policy: 3\n", BASE_YAML),
     "policy", ["expected a table", "allowed keys: grace_s, warm_headroom, enforcement"]),
    ("unknown-enforcement", "c.toml", _edit('"prepaid"', '"postpaid"'),
     "policy.enforcement", ["'postpaid'", "allowed: prepaid, grant_instant"]),
    ("unknown-class", "c.toml", _edit('class = "batch"', 'class = "urgent"'),
     "campaigns.storm.class", ["'urgent'", "allowed: interactive, batch, opportunistic"]),
    ("unknown-dimension", "c.toml", _edit("[campaigns.storm.inference]", "[campaigns.storm.tpu]"),
     "campaigns.storm.tpu", ["unknown key 'tpu'", "gpu, cpu, mem_gb, fs_bw, inference"]),
    ("unknown-pool-dimension", "c.toml", _edit("mem_gb = 64", "tpu = 4"),
     "pool.groups.node.tpu", ["unknown key 'tpu'", "gpu, cpu, mem_gb"]),
    ("unknown-rate-dimension", "c.toml", _edit("inference = 100", "iops = 100"),
     "pool.rate_capacity.iops", ["allowed: fs_bw, inference"]),
    ("negative-burst", "c.toml", _edit("burst = 8", "burst = -8"),
     "campaigns.storm.gpu.burst", ["-8", "allowed: numbers >= 0"]),
    ("not-finite", "c.toml", _edit("burst = 8", "burst = inf"),
     "campaigns.storm.gpu.burst", ["finite number"]),
    ("bad-bucket", "c.toml", _edit("bucket = 1000", 'bucket = "lots"'),
     "campaigns.storm.gpu.bucket", ["'lots'", '"unlimited"']),
    ("guarantee-above-burst", "c.toml",
     _edit(_GPU_ENV, "guarantee = 6\nsustained = 4\nburst = 5"),
     "campaigns.storm", ["gpu.guarantee (6.0) may not exceed gpu.burst (5.0)"]),
    ("preemptible-guarantee", "c.toml", _edit("[campaigns.fill.gpu]\n",
                                              "[campaigns.fill.gpu]\nguarantee = 1\n"),
     "campaigns.fill", ["preemptible campaign cannot hold a guarantee", "guarantee = 0"]),
    ("bad-campaign-name", "c.toml", _edit("campaigns.fill", "campaigns.Fill").replace(
        "campaigns.fill", "campaigns.Fill"),
     "campaigns.Fill", ["must match", "lower-case"]),
    ("guarantees-above-capacity", "c.toml",
     _edit(_GPU_ENV, "guarantee = 20\nsustained = 4\nburst = 20"),
     "campaigns.*.gpu.guarantee",
     ["add up to 20 GPUs", "storm 20", "allowed: a total of at most 16"]),
    ("rate-guarantee-without-capacity", "c.toml", _edit("inference = 100", "fs_bw = 100"),
     "campaigns.*.inference.guarantee", ["pool.rate_capacity.inference", "at most 0"]),
    ("zero-nodes", "c.toml", _edit("count = 4\nwarm = 2", "count = 0\nwarm = 0"),
     "pool.groups.node.count", ["allowed: numbers > 0"]),
    ("duplicate-node-names", "c.toml",
     _edit("mem_gb = 64\n", 'mem_gb = 64\n[pool.groups.more]\ncount = 1\nprefix = "node"\n'),
     "pool.groups.more.prefix", ["'node000' is also generated by group 'node'"]),
    ("warm-above-count", "c.toml", _edit("warm = 2", "warm = 5"),
     "pool.groups.node.warm", ["allowed: 0 to 4"]),
    ("no-groups", "c.yaml", _edit("    node: {count: 4, warm: 2, gpu: 4, cpu: 16, mem_gb: 64}\n",
                                  "    {}\n", BASE_YAML).replace("groups:\n    {}", "groups: {}"),
     "pool.groups", ["must not be empty"]),
    ("missing-pool", "c.toml", BASE_TOML[BASE_TOML.index("[policy]"):],
     "pool", ["required key is missing"]),
    ("headroom-above-capacity", "c.toml", _edit("[policy.warm_headroom]\ngpu = 4",
                                                "[policy.warm_headroom]\ngpu = 64"),
     "policy.warm_headroom.gpu", ["allowed: 0 to 16"]),
    ("toml-syntax", "c.toml", _edit("grace_s = 10", "grace_s = = 10"),
     "line 13, column", ["invalid TOML", "allowed: TOML 1.0 syntax"]),
    ("yaml-syntax", "c.yaml", _edit("  grace_s: 10", "  grace_s: [10", BASE_YAML),
     "line ", ["invalid YAML", "allowed: YAML 1.1 syntax"]),
    ("yaml-not-a-table", "c.yaml", "- 1\n- 2\n",
     "(top level)", ["expected a table", "allowed keys: pool, policy, campaigns"]),
    ("missing-file", "absent.toml", None, "(file)", ["no such file"]),
    ("unknown-extension", "c.json", "{}", "(file)", ["allowed: .toml, .yaml, .yml"]),
]
# fmt: on


@pytest.mark.parametrize(
    ("name", "text", "key", "fragments"),
    [pytest.param(n, t, k, f, id=i) for i, n, t, k, f in BAD],
)
def test_bad_config_names_file_key_and_allowed_values(
    tmp_path: Path, name: str, text: str | None, key: str, fragments: list[str]
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert err.path == str(path)
    assert err.key.startswith(key), (err.key, key)
    shown = str(err)
    assert shown.startswith(f"{path}: {err.key}: ")
    for fragment in fragments:
        assert fragment in shown, (fragment, shown)


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    text = _edit("burst = 8", "burst = -8")
    text = _edit('"prepaid"', '"postpaid"', text)
    text = _edit("warm = 2", "warm = 9", text)
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, "c.toml", text))
    shown = str(info.value)
    assert "policy.enforcement" in shown
    assert "also campaigns.storm.gpu.burst" in shown


def test_config_error_is_raised_before_semantic_checks_on_shape_errors(tmp_path: Path) -> None:
    # The whole-file rules only run on a well-formed document; a shape error alone is shown.
    text = _edit("warm = 2", "warm = 9", _edit("count = 4", 'count = "x"'))
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, "c.toml", text))
    assert info.value.key == "pool.groups.node.count"


# ---------------------------------------------------------------------------------------
# The backend a file is for: its `backend` key, and validation that names that backend.

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CAMPAIGNS_ONLY = """\
[campaigns.sci]
gpu = { guarantee = 8, sustained = 16, burst = 32, bucket = 200000 }
inference = { guarantee = 50, sustained = 100, burst = 100 }
"""


def _pool(gpus: int) -> PoolSpec:
    return PoolSpec(groups=(NodeGroup(count=1, resources={"gpu": gpus, "cpu": 8}, warm=1),))


@pytest.mark.parametrize(("name", "backend"), [("local.toml", "local"), ("slurm.toml", "slurm")])
def test_the_example_configs_say_their_backend_and_are_valid_for_it(
    name: str, backend: str
) -> None:
    path = EXAMPLES / name
    assert file_backend(path) == backend
    cfg = load_config(path, backend=backend)  # type: ignore[arg-type]
    assert cfg.backend == backend
    assert {c.name for c in cfg.campaigns} >= {"adaptive-sci", "backfill"}
    assert cfg.policy.power_down_idle_s is None
    assert (cfg.slurm is not None) == (backend == "slurm")


def test_a_file_without_the_key_is_for_no_backend_in_particular(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE_TOML, encoding="utf-8")
    assert file_backend(path) is None
    assert load_config(path).backend is None


def test_an_unknown_backend_value_names_the_allowed_ones(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('backend = "k8s"\n' + BASE_TOML, encoding="utf-8")
    for read in (file_backend, load_config):
        with pytest.raises(ConfigError) as info:
            read(path)
        assert info.value.key == "backend"
        assert "unknown value 'k8s'; allowed: simulated, local, slurm" in str(info.value)


@pytest.mark.parametrize(
    ("backend", "why"),
    [("local", "the local backend discovers the nodes on this machine"),
     ("slurm", "the Slurm backend discovers the nodes from Slurm")],
)  # fmt: skip
def test_a_demo_derived_file_is_refused_in_the_words_of_the_backend_in_force(
    backend: str, why: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(default_config_text(), "toml", backend=backend)  # type: ignore[arg-type]
    err = info.value
    assert err.key == "pool.groups" and err.message.startswith(why)
    # Both keys such a file must lose, in one message.
    assert "also policy.power_down_idle_s: " in err.message
    assert ("Slurm" in err.message) == (backend == "slurm")


def test_the_local_backend_refuses_a_slurm_table() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config('[slurm]\npartition = "gpu"\n' + CAMPAIGNS_ONLY, "toml", backend="local")
    assert info.value.key == "slurm"
    assert "only the Slurm backend reads the [slurm] table" in info.value.message


def test_guarantees_are_checked_against_the_discovered_nodes() -> None:
    text = "[pool.rate_capacity]\ninference = 100\n" + CAMPAIGNS_ONLY
    cfg = parse_config(text, "toml", backend="local", discover=lambda _s: _pool(8))
    assert cfg.pool.groups[0].resources["gpu"] == 8 and cfg.slurm is None
    with pytest.raises(ConfigError) as info:
        parse_config(text, "toml", backend="local", discover=lambda _s: _pool(4))
    assert info.value.key == "campaigns.*.gpu.guarantee"
    assert "but the pool has 4 GPUs (from this machine)" in info.value.message


def test_without_discovery_only_the_rate_guarantees_are_checked() -> None:
    # Away from the cluster the placed capacity is unknown; the rate capacity is the file's.
    text = "[pool.rate_capacity]\ninference = 100\n" + CAMPAIGNS_ONLY
    cfg = parse_config(text, "toml", backend="slurm")
    assert cfg.pool.groups == () and cfg.slurm is not None
    with pytest.raises(ConfigError) as info:
        parse_config(text.replace("inference = 100", "inference = 10"), "toml", backend="slurm")
    assert info.value.key == "campaigns.*.inference.guarantee"


def test_the_simulated_backend_takes_no_discovery() -> None:
    with pytest.raises(ValueError, match="no discover"):
        parse_config(BASE_TOML, "toml", backend="simulated", discover=lambda _s: _pool(8))
