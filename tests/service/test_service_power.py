"""Power as a leased dimension through the service: a config with node power, a cap and a
campaign's power envelope; leases asked over real gRPC with and without a declared power
limit; the supply signals' power headroom and price, in the client and in `bursar supply`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from server import Server

from bursar.cli.main import main
from bursar.providers.client import BrokerClient, InvalidArgument, OutOfRange

CONFIG = """
[pool]
boot_latency_s = 0.5

[pool.groups.node]
count = 4
warm = 4
gpu = 8
cpu = 64
mem_gb = 512
idle_w = 500
peak_w = 2100

[policy]
grace_s = 1
power_cap_w = 5600
power_down_idle_s = 600

[campaigns.sci.gpu]
burst = 32
[campaigns.sci.power]
sustained = 1600
burst = 4000
bucket = 36000000

[campaigns.other.gpu]
burst = 32
"""


@pytest.fixture
def broker(tmp_path: Path):
    cfg = tmp_path / "power.toml"
    cfg.write_text(CONFIG)
    with Server(tmp_path / "state", "--config", str(cfg)) as server:
        yield server


def test_leases_draw_watts_under_the_cap_and_supply_says_how_many_are_left(broker) -> None:
    tokens = broker.tokens()
    with (
        BrokerClient(broker.address, tokens["sci"]) as sci,
        BrokerClient(broker.address, tokens["other"]) as other,
    ):
        # 4 idle nodes draw 2,000 W; 8 GPUs at the default 200 W each leave 2,000 W.
        first = sci.acquire({"gpu": 8}, 600, blocking=False)
        s = sci.supply()
        assert s.power is not None
        assert (s.power.cap_w, s.power.draw_w, s.power.idle_w) == (5600, 3600, 2000)
        assert s.power.headroom_w == 2000
        assert s.campaigns["sci"].held["power"] == 1600
        # 24 GPUs draw more than sci's power burst: refused at once. Another campaign's
        # 8 GPUs at a 150 W-per-GPU power limit fit under the cap.
        with pytest.raises(OutOfRange) as out:
            sci.acquire({"gpu": 24}, 600, blocking=False)  # 4,800 W: above sci's power burst
        assert "power burst" in str(out.value)
        second = other.acquire({"gpu": 8, "power": 1200}, 600, blocking=False)
        assert other.supply().power.headroom_w == 800
        with pytest.raises(InvalidArgument) as err:
            other.acquire({"gpu": 8, "power": -1}, 600, blocking=False)
        assert "size.power" in str(err.value)
        sci.release(first.id)
        other.release(second.id)

    res = CliRunner().invoke(
        main,
        ["supply", "--target", broker.address, "--token", tokens["sci"]],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    assert "power: cap 5600 W" in res.output and "headroom" in res.output
