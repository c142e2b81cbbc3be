"""A campaign's envelope changed on a live engine (``UpdateCampaign``): the invariants
hold when a burst is lowered below what the campaign holds."""

from __future__ import annotations

from conftest import build_engine, gpu_campaign
from engine_support import (
    kinds,
    one,
    req,
)

from bursar.broker.decisions import (
    Rejected,
)
from bursar.broker.events import (
    Renew,
    UpdateCampaign,
)
from bursar.broker.reasons import Reason


def test_invariants_hold_after_an_update_lowers_the_burst_below_holdings():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 16)])
    eng.apply(req(0, "a", 16, 100))
    assert kinds(eng.apply(UpdateCampaign(at=1, spec=gpu_campaign("a", 0, 8, 8)))) == [
        "CampaignSet"
    ]
    # New leases and renewals are refused above the new ceiling...
    assert one(eng.apply(Renew(at=2, lease_id="L1", duration_s=100)), Rejected).reason is (
        Reason.ABOVE_BURST
    )
    # ...but holding above it until the leases end is allowed.
    eng.check_invariants()
