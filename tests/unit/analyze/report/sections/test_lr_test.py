"""The learning-rate range test section (pipelines.analyze.report.sections.lr_test)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.analyze.report import figures as report_figures
from pipelines.analyze.report.sections.lr_test import lr_test

pytestmark = pytest.mark.trainer


def test_report_explains_the_range_tests_choice_and_scales_its_plot(monkeypatch):

    lrs = list(np.geomspace(1e-4, 3.0, 30))
    smoothed = [2.3 - 1.5 / (1 + (1e-2 / lr) ** 2) for lr in lrs[:-3]] + [3.0, 9.0, 40.0]
    result = {
        "learning_rate": 0.02, "lr_range": [1e-3, 0.05], "global_batch": 64, "steps": 30, "ranks": 2,
        "stopped": "diverged at lr 3", "method": "range_test+confirm", "diverged_at": 3.0,
        "reason": "min-loss rate 0.05 of the poly4 fit; x0.5 ended lowest",
        "curve": {"lr": lrs, "loss": smoothed, "smoothed": smoothed},
        "candidates": [{"lr": 0.025, "factor": 0.5, "trial_loss": 0.81, "trial_se": 0.0375},
                       {"lr": 0.05, "factor": 1.0, "trial_loss": 0.9},  # a result of rule 5 and earlier: no spread
                       {"lr": 0.1, "factor": 2.0, "trial_loss": None}],
        "references": {"fastai_valley": 0.004, "lightning": 0.01},
        "fits": {"poly": {"degree": 2, "coefficients": [0.5, 1.0, 1.2]}, "log_fit": {"a": 0.2, "b": -0.5},
                 "points": {"x": [-4.0, -1.3]}},
    }
    limits = []
    real_img = report_figures.img
    monkeypatch.setattr(report_figures, "img", lambda fig, alt: limits.append(fig.axes[0].get_ylim()) or real_img(fig, alt))
    html_text = lr_test(result)
    assert "Why: min-loss rate 0.05 of the poly4 fit; x0.5 ended lowest." in html_text
    assert html_text.count("<tr>") == 4 and "0.81" in html_text  # a header and one row per candidate
    assert "<td>0.0375</td>" in html_text and "<th>its standard error</th>" in html_text
    (low, high), = limits
    assert high < 3.0 and low < min(smoothed)  # the divergence spike is off the chart, the minimum on it
