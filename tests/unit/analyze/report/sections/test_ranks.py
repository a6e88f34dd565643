"""The per-rank and balance sections (pipelines.analyze.report.sections.ranks)."""

from __future__ import annotations

import pytest

from pipelines.analyze.report import figures as report_figures
from pipelines.analyze.report.sections.ranks import balance, per_rank, rank_series_plot, rank_table

pytestmark = pytest.mark.trainer


def test_per_rank_section_pieces():
    ranks = [
        {"rank": 0, "device": "<fast>", "batch": 40, "samples_per_sec": 200.0, "balance_efficiency": 0.9},
        {"rank": 1, "device": "slow", "batch": 24},
    ]
    table = rank_table(ranks)
    assert table.count("<tr>") == 3  # the header and one row per rank
    assert "&lt;fast&gt;" in table and "<fast>" not in table
    assert "<td>90.0%</td>" in table and "<td>–</td>" in table  # efficiency; a missing figure
    assert rank_series_plot({"train/loss": [(0, 0.0, 1.0)]}) == ""  # no per-rank scalars
    assert rank_series_plot({"rank1/batch": [(0, 0.0, 24.0)]}).count("<img") == 1
    assert per_rank({"ranks": ranks}, {}).count("<img") == 1  # the bars, then the table
    assert "lists no ranks" in per_rank({}, {"rank0/batch": [(0, 0.0, 40.0)]})


def test_time_bars_stack_every_part_of_each_ranks_loop(monkeypatch):
    ranks = [
        {"rank": 0, "device": "fast", "batch": 40, "compute_s": 8.0, "wait_s": 0.5, "input_wait_s": 0.2, "other_s": 0.8},
        {"rank": 1, "device": "slow", "batch": 24, "compute_s": 9.0, "wait_s": 0.4, "input_wait_s": 0.1, "other_s": 0.0},
    ]
    figures = []
    real_img = report_figures.img
    monkeypatch.setattr(report_figures, "img", lambda fig, alt: figures.append(fig) or real_img(fig, alt))
    html_text = per_rank({"ranks": ranks, "steady_seconds": 9.5}, {})
    ax = figures[0].axes[0]
    tops = {round(p.get_x() + p.get_width() / 2): p.get_y() + p.get_height() for p in ax.patches}
    assert tops == pytest.approx({0: 9.5, 1: 9.5})  # both ranks' parts reach the same loop wall time
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "compute", "allreduce wait", "input wait", "other (host)", "loop wall time"}
    assert "<th>Other s</th>" in html_text and "<td>0.8</td>" in html_text


def test_balance_section_says_what_the_figure_is():
    text = balance({"steady_seconds": 12.5}, {}, {"balance_efficiency": 0.8432})
    assert "84.3% of the 12.5 s steady loop" in text and "spent computing" in text
    assert "No balance/efficiency scalars" in text
