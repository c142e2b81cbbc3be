"""The engine's journals, pinned: a change to the admission pass's code that is not a change
of its rules (``RULES_VERSION``) must leave every one of them byte for byte as it was.

Pinned here: the agent-burst scenario's journal for seeds 1-3 (what ``bursar sim run``
writes), the scripted demo's journal, and the broker replay policy's schedule and metrics
on KTH-SP2, with fair share on and off. A deliberate change of the rules that alters them
bumps ``RULES_VERSION`` and updates these digests (and regenerates the published figures
the change alters) in the same work.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bursar.sim.demo import run_demo
from bursar.sim.replay.run import replay_trace
from bursar.sim.scenario import run_seed

TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)
KTH = TRACES / "pwa-kth-sp2" / "KTH-SP2-1996-2.1-cln.swf.gz"

SCENARIO = {
    1: "e51e72df19818324cd47ce963d6cb537a0a9e87b5cac111197b6c987ec5fbb51",
    2: "2d97934a890d2fdc6693f280b3fab9e60da628e3dbfd05f97224c5d9a75d570d",
    3: "2bb72a8121fb65591458710c344a9f4868057bc87fbfd79d0881ce9896f46645",
}
DEMO = "c971a8fe04765b91af966e2a04a567751bd25160ae819552cd4e5d548b49540a"
KTH_REPLAY = {
    "bursar": (
        "6d19d75eadecb23ac9b41d6911202c698fafbaeb886ef4f4e60eac9e7fac95b5",
        "e4188266d384f85ab515ffc80704dbd3260ae4266cfb910d602de2da9a3122c6",
    ),
    "bursar-arrival": (
        "09c4691035c68e853c1a0ae84e26bec5c0f8d86d6597a4186939697d8b13ac40",
        "c4eac8b6d8671dfa8e4a8fc22d501142f49e282a332c52f7f2e6de0482b0bc68",
    ),
}


@pytest.mark.parametrize("seed", sorted(SCENARIO))
def test_the_scenario_journal_is_the_pinned_one(seed: int, tmp_path: Path) -> None:
    assert run_seed(seed, tmp_path).journal_sha256 == SCENARIO[seed]


def test_the_demo_journal_is_the_pinned_one(tmp_path: Path) -> None:
    demo, sha = run_demo(tmp_path)
    demo.broker.close()
    assert sha == DEMO


@pytest.mark.parametrize("policy", sorted(KTH_REPLAY))
def test_the_broker_replay_of_kth_sp2_is_the_pinned_one(policy: str) -> None:
    if not KTH.is_file():
        pytest.skip(f"no trace at {KTH} (set BURSAR_TRACES_DIR)")
    outputs = replay_trace(KTH, policy).manifest["outputs"]
    assert (outputs["schedule_sha256"], outputs["metrics_sha256"]) == KTH_REPLAY[policy]
