"""The predicted against actual run time section (pipelines.analyze.report.sections.timing)."""

from __future__ import annotations

import pytest

from pipelines.analyze.report import ReportInputs, build_report

pytestmark = pytest.mark.trainer


def test_report_shows_the_run_time_part_by_part_and_earlier_runs():
    timing = {"parts": {"startup": 0.1, "calibration": 1.2, "tracing": 2.0, "steps": 5.0, "checkpoints": 0.1, "other": 0.4},
              "uncorrected": {}, "corrections": {"runs": 3, "parts": {"steps": {"factor": 1.5, "per_unit": 0.002},
                                                                   "other": {"factor": 0.0, "per_unit": 0.4}}}}
    estimate = {"plan": {"predicted_total_s": 8.8, "timing": timing, "ranks": []},
                "profiles": {"fast": {"fixed_s": 0.002, "per_sample_s": 1e-5, "max_batch": 900,
                                      "source": "predicted by the bank's 'flops' law"}}}
    learned = {"recorded": True, "parts": {"steps": {"actual": 5.5}, "tracing": {"actual": 1.9}},
               "earlier": [{"run": "dag/r1/k", "predicted_s": 10.0, "actual_s": 8.0, "error": 0.25}]}
    html_text = build_report(ReportInputs(train={"train_seconds": 9.0}, scalars={}, metrics={"prediction_error": -0.02},
                             estimate=estimate, learned=learned))
    section = html_text.split('id="predicted-vs-actual-run-time"')[1].split("</section>")[0]
    assert "Part by part" in section and "<td>+ 0.4 s</td>" in section
    assert '<td class="l">steps</td><td>5</td><td>5.5</td><td>× 1.5 + 2 ms per step</td>' in section
    assert "not measured" in section  # startup: no actual in this record
    assert "latest 3 run(s) on this pool" in section and "dag/r1/k" in section and "25.0%" in section
    assert "predicted by the bank&#x27;s &#x27;flops&#x27; law" in section
    unlearned = build_report(ReportInputs(train={"train_seconds": 9.0}, scalars={}, metrics={}, estimate=estimate,
                             learned={"recorded": False, "why_not": "a resumed run", "earlier": []}))
    assert "This run was not added to the profile bank: a resumed run." in unlearned
