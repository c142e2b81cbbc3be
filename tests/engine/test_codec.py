"""The canonical encoder: the fast path writes exactly what the standard library's encoder
writes (sorted keys, no spaces, ASCII escapes, floats as ``repr``, NaN and infinity
refused), for any nested value, and the journals of the demo and the scenario are the
bytes the standard encoder gives."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bursar.broker import codec
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.sim.demo import run_demo
from bursar.sim.scenario import run_seed

# Floats where orjson and ``repr`` part ways (under 1e-4) and the edges of the range.
_FLOATS = (
    st.floats()
    | st.floats(min_value=-1e-3, max_value=1e-3)
    | st.floats(min_value=1e15, max_value=1e17)
    | st.integers(-330, 310).map(lambda e: float(f"1e{e}"))
    | st.sampled_from([5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0, 1e-5])
)
_TEXT = (
    st.text()
    | st.text(st.characters(min_codepoint=0, max_codepoint=0x80))
    | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**64), 2**64)
    | _FLOATS
    | _TEXT
    | st.sampled_from(["e-5", "0.00001", "null", "\x7f", "é"])
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(_TEXT, inner, max_size=5)
        | st.dictionaries(st.integers() | st.none() | st.booleans(), inner, max_size=3)
    ),
    max_leaves=30,
)


def _outcome(f: Any, x: Any) -> tuple[str, Any]:
    try:
        return "ok", f(x)
    except (TypeError, ValueError) as exc:
        return "error", type(exc)


@settings(max_examples=2000, deadline=None)
@given(_VALUES)
@example({"at": 1e-7, "b": [1e-5, 1e16, -1.5e-300]})
@example({"x": math.inf})
@example({"x": [math.nan, None]})
@example({"ünï": "\x7f\x00\u2028"})
@example(2**64)
@example({1: "a", "b": 2})
def test_fast_encoder_writes_what_the_reference_writes(x: Any) -> None:
    assert _outcome(codec.dumps, x) == _outcome(codec.reference_dumps, x)


@settings(max_examples=1000, deadline=None)
@given(_VALUES)
def test_plain_values_encode_alike(x: Any) -> None:
    p = codec.plain(x)
    assert _outcome(codec.dumps_plain, p) == _outcome(codec.reference_dumps, p)


@pytest.mark.parametrize("which", ["demo", "scenario"])
def test_journal_bytes_are_the_reference_encoders(tmp_path: Path, which: str) -> None:
    """Every stored row, and so the canonical form and its hash, is what the standard
    encoder writes for the same values: the faster encoder leaves journals as they were."""
    if which == "demo":
        demo, sha = run_demo(tmp_path)
        demo.broker.close()
    else:
        sha = run_seed(7, tmp_path, duration=2400.0).journal_sha256
    with Journal.open(tmp_path / JOURNAL_FILENAME) as j:
        assert j.sha256() == sha
        lines = [
            codec.reference_dumps(
                {
                    "format": "bursar-journal/1",
                    "pool": json.loads(j.meta_value("pool") or "null"),
                    "policy": json.loads(j.meta_value("policy") or "null"),
                }
            )
        ]
        rows = 0
        for seq, event, decisions in j.raw_entries():
            assert event == codec.reference_dumps(json.loads(event)), seq
            assert decisions == codec.reference_dumps(json.loads(decisions)), seq
            lines.append(
                codec.reference_dumps(
                    {"seq": seq, "event": json.loads(event), "decisions": json.loads(decisions)}
                )
            )
            rows += 1
        assert rows > 100
        assert lines[0] == j.meta_line
        raw = "".join(line + "\n" for line in lines).encode()
        assert hashlib.sha256(raw).hexdigest() == sha
