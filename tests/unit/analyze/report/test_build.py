"""The report from its sections (pipelines.analyze.report.build)."""

from __future__ import annotations

import pytest

from pipelines.analyze.report import SECTIONS, ReportInputs, build_report

pytestmark = pytest.mark.trainer


def test_report_sections_without_inputs_say_so():
    lr_fixed = {"learning_rate": 0.1, "method": "fixed", "curve": {"lr": [], "loss": []}}
    html_text = build_report(ReportInputs(train={}, scalars={}, metrics={}, lr_search=lr_fixed))
    for heading in SECTIONS:
        assert f"<h2>{heading}</h2>" in html_text
    assert "learning rate was fixed at 0.1" in html_text
    assert "No train/loss" in html_text and "No held-out evaluation" in html_text
    assert "No weight histograms (weights/* tags) in the event files" in html_text
    assert "<img" not in html_text
