"""The elastic setting every plugin shares (providers/elastic.py): parsed once, turned
into the broker's intent for units of a block's size, and units counted back from a
lease's size. Properties over sizes and ranges (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bursar.providers.elastic import Elastic, units_in

DIMS = ("cpu", "mem_gb", "gpu")
units = st.dictionaries(
    st.sampled_from(DIMS), st.integers(1, 64).map(lambda n: n / 4), min_size=1, max_size=3
)


@given(unit=units, lo=st.integers(1, 8), extra=st.integers(0, 8), k=st.integers(0, 20))
def test_an_intent_spans_whole_units_and_they_count_back(
    unit: dict[str, float], lo: int, extra: int, k: int
) -> None:
    e = Elastic(lo, lo + extra, work=60.0, deadline=600.0, amdahl=0.1)
    intent = e.intent(unit)
    assert intent.step == unit and set(intent.min) == set(intent.max) == set(unit)
    assert units_in(unit, intent.min) == lo and units_in(unit, intent.max) == lo + extra
    # Any whole number of units counts back exactly; a lease short in one dimension
    # holds only the units every dimension can fill.
    size = {d: v * k for d, v in unit.items()}
    assert units_in(unit, size) == k
    d = next(iter(unit))
    short = {**size, d: unit[d] * k - unit[d] / 2} if k else size
    assert units_in(unit, short) == max(0, k - 1)


@pytest.mark.parametrize(
    ("given_", "why"),
    [
        ({"max": 2, "work": 1}, "missing"),
        ({"max": 2, "work": 1, "deadline": 5, "colour": 1}, "unknown keys"),
        ({"min": 0, "max": 2, "work": 1, "deadline": 5}, "1 <= min <= max"),
        ({"max": 2.5, "work": 1, "deadline": 5}, "whole units"),
        ({"max": 2, "work": 1, "deadline": "soon"}, "numbers"),
        ({"max": 2, "work": 1, "deadline": 5, "amdahl": 1.5}, "amdahl"),
    ],
)
def test_a_bad_elastic_setting_says_what_is_wrong(given_: dict[str, object], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Elastic.parse(given_)


def test_keys_may_be_written_either_way_and_durations_as_clock_times() -> None:
    e = Elastic.parse({"max": 3, "work": 90, "deadline": "01:00:00", "amdahl": 0.2})
    assert e == Elastic(1, 3, 90.0, 3600.0, 0.2, 1.0)
    assert Elastic.parse({"min": 2, "max": 2, "work": 1, "deadline": 5, "value": 3}).value == 3
