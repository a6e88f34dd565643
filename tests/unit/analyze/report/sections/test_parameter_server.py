"""The parameter-server section (pipelines.analyze.report.sections.parameter_server)."""

from __future__ import annotations

import pytest

from analyze.synthetic import (
    capture_images,
    ps_train,
    ps_updates,
    section,
)
from pipelines.analyze.report import ReportInputs, build_report
from pipelines.analyze.report.sections.parameter_server import STALENESS_ROWS, staleness_rows
from pipelines.stores.rundir import RunDir

pytestmark = pytest.mark.trainer


def test_parameter_server_section_for_async_mode_without_an_updates_file(monkeypatch):
    figures = capture_images(monkeypatch)
    train = ps_train(RunDir("/nowhere"), mode="async")
    train["parameter_server"]["lost_workers"] = []
    html_text = build_report(ReportInputs(train=train, scalars={}, metrics={}))
    ps = section(html_text, "parameter-server")
    assert "Update mode <b>async</b>: each update is applied as it arrives" in ps
    assert not figures["staleness histogram"].axes[0].get_lines()  # no bound to mark
    assert "No worker was lost." in ps and "lost after" not in ps
    assert "No updates file (/nowhere/train/updates.jsonl)" in ps
    assert "updates over time per worker" not in figures

    mismatch = build_report(ReportInputs(train=train, scalars={}, metrics={}, updates=ps_updates()[:100]))
    assert "The updates file holds 100 updates; the train result counts 260." in mismatch
    older = build_report(ReportInputs(train={"strategy": "parameter_server", "ranks": []}, scalars={}, metrics={}))
    assert "no parameter_server figures" in section(older, "parameter-server")


def test_bounded_mode_shows_the_clocks_the_waits_and_the_staleness_bound(monkeypatch):
    figures = capture_images(monkeypatch)
    train = ps_train(RunDir("/nowhere"), mode="bounded")
    ps = section(build_report(ReportInputs(train=train, scalars={}, metrics={})), "parameter-server")
    assert "stale-synchronous: a worker more than 4 clock(s)" in ps and "reaches the servers more than 18" in ps
    assert "(its updates the servers received, applied or dropped) ahead" in ps and "the wait itself drops none" in ps
    # a clock counts dropped updates too (and a resume raises it): never called the updates applied
    assert ("Final clocks (each worker's updates the servers received, applied or dropped; a resumed run sets every "
            "clock to the largest saved one): worker 0: 120, worker 1: 40, worker 2: 100.") in ps
    assert "updates applied per worker" not in ps and "its updates applied)" not in ps
    assert "widest gap at which an update began computing: 4 clock(s) ahead of the slowest worker (bound: 4)" in ps
    assert "waited 3.5 s in all for the clocks; 3 update(s) gave up waiting" in ps
    assert "the <b>workers</b> wait for their clock" in ps and "the <b>chief</b> schedules" in ps
    assert "<th>Clock</th><th>Max clock gap</th><th>Clock wait s</th><th>Deferred</th>" in ps
    assert "<td>120</td><td>4</td><td>2.5</td><td>2</td>" in ps  # worker 0's clock, gap, wait, deferrals
    (line,) = figures["staleness histogram"].axes[0].get_lines()
    assert line.get_xdata()[0] == 18.5 and "bound (N − 1)(2s + 1): 18" in line.get_label()

    train["parameter_server"].update(combiner="drop_stale", clocks=None)  # the drop limit marked; old results
    figures.clear()
    ps = section(build_report(ReportInputs(train=train, scalars={}, metrics={})), "parameter-server")
    assert "Final clocks" not in ps
    (line,) = figures["staleness histogram"].axes[0].get_lines()
    assert line.get_xdata()[0] == 4.5 and line.get_label() == "dropped above: 4"


def test_sync_mode_shows_the_rounds_cuts_and_each_workers_share():
    train = ps_train(RunDir("/nowhere"), mode="sync")
    block = train["parameter_server"]
    block.update(rounds=20, round_rows=192, round_chunks_mean=7.5, round_cut=2,
                 round_cut_s_per_row={"1": 0.0004, "2": 0.0002, "4": 0.00035})
    block["workers"] = [{**w, "round_share": share, "round_share_min": share - 0.05, "round_share_max": share + 0.05}
                        for w, share in zip(block["workers"], (0.6, 0.1, 0.3), strict=True)]
    ps = section(build_report(ReportInputs(train=train, scalars={}, metrics={})), "parameter-server")
    assert "Update mode <b>sync</b>: each round of B rows is cut into chunks" in ps
    assert "20 round(s) of 192 rows, 7.5 chunks each on average; the last cut 2 chunk(s) per worker." in ps
    assert "1 chunk(s) per worker: 0.4 ms, 2 chunk(s) per worker: 0.2 ms" in ps
    assert "worker 0 (fast): 60.0% (55.0% to 65.0%), worker 1 (slow): 10.0%" in ps
    assert "round(s) of" not in section(build_report(ReportInputs(train=ps_train(RunDir("/nowhere"), mode="async"),
                                                                  scalars={}, metrics={})), "parameter-server")


def test_a_long_staleness_histogram_groups_its_stalest_rows():
    rows = staleness_rows([1] * 40)
    assert len(rows) == STALENESS_ROWS and rows[-1][:2] == (f"{STALENESS_ROWS - 1} to 39", 40 - STALENESS_ROWS + 1)
    assert [r[0] for r in staleness_rows([3, 0, 1])] == ["0", "2"]  # empty values left out
