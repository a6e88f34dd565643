"""Sections register the strategies they apply to (pipelines.analyze.report.registry)."""

from __future__ import annotations

import pytest

from pipelines.analyze.report import PS_SECTIONS, SECTIONS, section
from pipelines.analyze.report.registry import registered

pytestmark = pytest.mark.trainer


def test_each_strategy_gets_its_registered_sections_in_place_order():
    assert tuple(s.heading for s in registered("horovod")) == SECTIONS
    assert tuple(s.heading for s in registered("parameter_server")) == PS_SECTIONS
    both = set(SECTIONS) & set(PS_SECTIONS)
    assert {"Re-balance events", "Per-rank throughput and waiting"} == set(SECTIONS) - both
    assert {"Parameter server", "Per-worker throughput and waiting"} == set(PS_SECTIONS) - both


def test_a_section_that_clashes_or_names_no_known_strategy_is_refused():
    with pytest.raises(ValueError, match="clashes with 'Summary'"):
        section("Summary", place=999)(lambda r: "")
    with pytest.raises(ValueError, match="clashes with 'Re-balance events'"):
        section("Another", place=70, strategies={"horovod"})(lambda r: "")
    with pytest.raises(ValueError, match="strategies must be some of"):
        section("Elsewhere", place=999, strategies={"mirrored"})
    assert tuple(s.heading for s in registered("horovod")) == SECTIONS  # nothing was added
