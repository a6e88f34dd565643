"""The history of a DAG's runs (pipelines.analyze.history): rows from synthetic run folders and a
model store with a promoted version, grouped per model and pool; the page's figures; and
``python -m pipelines history`` (its table, its JSON line, exit 2 on a missing folder)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analyze.figure_checks import misplaced_text
from pipelines.__main__ import main
from pipelines.analyze.history import collect, groups, history_path, refresh_history
from pipelines.analyze.history.page import ALTS, write_history
from pipelines.analyze.report import figures as report_figures
from pipelines.stores.models import ModelStore
from pipelines.stores.rundir import RunDir, write_json

pytestmark = pytest.mark.trainer

ROOT = Path(__file__).resolve().parents[3]
DAG = "train_pipeline"
POOL = {"device_types": [{"name": "slow", "count": 1}, {"name": "fast", "count": 1}]}
BIG_POOL = {"device_types": [{"name": "fast", "count": 2}]}


def _at(day: int) -> str:
    return dt.datetime(2026, 1, day, 10, tzinfo=dt.UTC).isoformat()


def _metrics(day: int, accuracy: float, run_id: str) -> dict:
    """A metrics.json as the analyze stage writes it now."""
    return {"holdout_accuracy": accuracy, "predicted_total_s": 40.0 + day, "actual_train_s": 50.0 + day,
            "prediction_error": -10 / (50 + day), "samples_per_sec": 800.0 + day, "balance_efficiency": 0.9,
            "strategy": "horovod", "run_id": run_id, "dag_id": DAG, "analyzed_at": _at(day), "input_key": "k"}


def _run(root: Path, folder: str, metrics: dict | str | None, *, model="small_cnn", pool=POOL, version=None,
         rate=None, promoted=None, published=None) -> Path:
    """A run folder under ``root/DAG`` with the files a finished run has (those asked for)."""
    run = root / DAG / folder
    write_json(run / "spec.json", {"model": {"name": model}, "launcher": "local", "pool": str(run / "pool.json")})
    write_json(run / "pool.json", pool)
    write_json(run / "train" / "result.json", {"learning_rate": 0.01, "ranks": [{"device": "fast"}]})
    if version:
        write_json(run / "publish" / "result.json", {"model": model, "version": version, "store": str(root / "models"),
                                                     "published_at": published})
    if rate:
        write_json(run / "lr_search" / "result.json", {"learning_rate": rate, "method": "confirmed"})
    if promoted is not None:
        write_json(run / "promote" / "result.json", {"model": model, "version": version, "promoted": promoted})
    if isinstance(metrics, dict):
        write_json(run / "analyze" / "metrics.json", metrics)
    elif isinstance(metrics, str):
        (run / "analyze").mkdir(parents=True)
        (run / "analyze" / "metrics.json").write_text(metrics)
    return run


@pytest.fixture
def root(tmp_path) -> Path:
    """An artifact root: small_cnn v0001 and v0002 published (v0002 promoted), a run of an older
    analyze stage, a run on another pool, a run of another model, one not analysed, one broken."""
    store, blob = ModelStore(str(tmp_path / "models")), tmp_path / "blob.txt"
    blob.write_text("model")
    for name in ("r1", "r2"):
        store.publish("small_cnn", {"blob.txt": blob}, {"run_id": name}, run_key=name)
    store.promote("small_cnn", "v0002")

    _run(tmp_path, "r1", _metrics(1, 0.81, "manual__2026-01-01T10:00:00+00:00"), version="v0001", rate=0.05,
         promoted=True)
    _run(tmp_path, "r2", _metrics(3, 0.86, "r2"), version="v0002", rate=0.04, promoted=True,
         published="2026-01-03T09:30:00+01:00")
    old = _run(tmp_path, "r0-old", {"holdout_accuracy": 0.7, "predicted_total_s": 30.0, "actual_train_s": 33.0})
    os.utime(old / "analyze" / "metrics.json", (dt.datetime(2026, 1, 2, tzinfo=dt.UTC).timestamp(),) * 2)
    _run(tmp_path, "r3", _metrics(4, 0.8, "r3"), pool=BIG_POOL, rate=0.08)
    _run(tmp_path, "r4", _metrics(5, 0.6, "r4"), model="tiny_mlp", rate=0.2)
    _run(tmp_path, "r5-running", None)
    _run(tmp_path, "r6-broken", '{"holdout_accuracy": 0.')
    return tmp_path


def test_runs_are_rows_in_time_order_with_the_promoted_version_marked(root, caplog):
    with caplog.at_level(logging.WARNING):
        history = collect(str(root), DAG)

    assert [r["run_id"] for r in history.runs] == ["manual__2026-01-01T10:00:00+00:00", "r0-old", "r2", "r3", "r4"]
    r1, old, r2, r3, r4 = history.runs
    assert (r1["version"], r1["promoted"], r1["promoted_by_run"]) == ("v0001", False, True)  # promoted once, not now
    assert (r2["version"], r2["promoted"]) == ("v0002", True)
    assert r2["time"] == "2026-01-03T08:30:00+00:00"  # when published (in UTC), not when analysed (10:00)
    assert r1["holdout_accuracy"] == 0.81 and r1["samples_per_sec"] == 801.0 and r1["balance_efficiency"] == 0.9
    assert (r1["predicted_total_s"], r1["actual_train_s"]) == (41.0, 51.0)
    assert (r1["learning_rate"], r1["lr_method"], r1["time"]) == (0.05, "confirmed", "2026-01-01T10:00:00+00:00")
    assert (r1["model"], r1["pool"], r1["launcher"], r1["strategy"]) == ("small_cnn", "fast:1,slow:1", "local", "horovod")
    # an older metrics.json: no time, run id, speed or balance; no publish or lr_search result
    assert old["time"] == "2026-01-02T00:00:00+00:00" and old["run_id"] == "r0-old"
    assert (old["samples_per_sec"], old["balance_efficiency"], old["version"], old["promoted"]) == (None, None, None, False)
    assert (old["holdout_accuracy"], old["learning_rate"], old["lr_method"]) == (0.7, 0.01, None)  # the train result's
    assert (r3["pool"], r4["model"]) == ("fast:2", "tiny_mlp")

    assert {k: [r["run_id"] for r in v] for k, v in groups(history.runs).items()} == {
        ("small_cnn", "fast:1,slow:1"): [r1["run_id"], "r0-old", "r2"],
        ("small_cnn", "fast:2"): ["r3"],
        ("tiny_mlp", "fast:1,slow:1"): ["r4"],
    }
    # not analysed yet: silently not a run; a broken metrics.json: left out, with a warning
    (skipped,) = history.skipped
    assert skipped["run_id"] == "r6-broken" and "r6-broken/analyze/metrics.json: not readable JSON" in skipped["why"]
    assert any("skipping run r6-broken" in m for m in caplog.messages)


def _images(html_text: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'<img alt="[^"]+" src="data:image/png;base64,([^"]+)"', html_text)]


def test_the_page_has_each_groups_figures_and_marks_the_promoted_version(root, monkeypatch):
    drawn: list[tuple[str, object]] = []
    real = report_figures.img
    monkeypatch.setattr(report_figures, "img", lambda fig, alt: (drawn.append((alt, fig)), real(fig, alt))[1])

    history, page = write_history(str(root), DAG)

    assert page == history_path(str(root), DAG) == root / DAG / "history.html"
    html_text = page.read_text()
    headings = re.findall(r"<h2>(.*?)</h2>", html_text)
    assert headings == ["small_cnn on fast:1,slow:1", "small_cnn on fast:2", "tiny_mlp on fast:1,slow:1"]
    pngs = _images(html_text)
    assert len(pngs) == 12 and all(p.startswith(b"\x89PNG") for p in pngs)
    assert [alt for alt, _ in drawn] == list(ALTS) * 3
    for alt, fig in drawn:
        assert not misplaced_text(fig), (alt, misplaced_text(fig))
    accuracy = drawn[0][1].axes[0]
    line, star = accuracy.get_lines()
    assert list(line.get_ydata()) == [0.81, 0.7, 0.86] and star.get_label() == "promoted"
    assert list(star.get_xdata()) == [2]  # v0002, the third run of the group
    assert [t.get_text() for t in accuracy.get_xticklabels()] == ["v0001", "r0-old", "v0002"]
    assert "v0002 (promoted)" in html_text and "the promoted version is v0002" in html_text
    assert "r6-broken" in html_text and "not readable JSON" in html_text  # said on the page too


def test_the_command_exits_2_naming_a_missing_folder(root, capsys):
    missing = root / "nowhere"
    done = subprocess.run([sys.executable, "-m", "pipelines", "history", "--artifact-root", str(missing), "--dag-id",
                           DAG], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == f"ERROR: artifact root {missing}: no such folder\n"

    assert main(["history", "--artifact-root", str(root), "--dag-id", "other_dag"]) == 2
    assert capsys.readouterr().err == (f"ERROR: DAG 'other_dag': no folder {root / 'other_dag'} (no run of it under "
                                       f"the artifact root {root})\n")


def test_the_command_prints_one_json_line_and_writes_the_page(root, capsys):
    assert main(["history", "--artifact-root", str(root), "--dag-id", DAG, "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    result = json.loads(out[0])
    assert result["page"] == str(root / DAG / "history.html") and Path(result["page"]).is_file()
    assert result["runs"] == collect(str(root), DAG).runs
    assert [s["run_id"] for s in result["skipped"]] == ["r6-broken"]


def test_the_command_prints_a_line_per_run_and_a_filter_needs_out_for_a_page(root, capsys):
    assert main(["history", "--artifact-root", str(root), "--dag-id", DAG, "--model", "small_cnn",
                 "--pool", "fast:1,slow:1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "history: 3 analysed runs of train_pipeline, 1 skipped; no page written (a filtered " \
                       "history needs --out)"
    assert lines[1] == "small_cnn on fast:1,slow:1:"
    rows = {line.split()[0]: line.split() for line in lines[3:6]}
    assert rows["r2"] == ["r2", "v0002", "*", "0.8600", "43.0", "/", "53.0", "803", "0.90", "0.04"]
    assert rows["r0-old"] == ["r0-old", "-", "0.7000", "30.0", "/", "33.0", "-", "-", "0.01"]
    assert "* the promoted version" in lines and any(line.startswith("skipped r6-broken: ") for line in lines)
    assert not (root / DAG / "history.html").exists()

    out = root / "small.html"
    assert main(["history", "--artifact-root", str(root), "--dag-id", DAG, "--model", "tiny_mlp", "--out", str(out),
                 "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["r4"]
    assert re.findall(r"<h2>(.*?)</h2>", out.read_text()) == ["tiny_mlp on fast:1,slow:1"]


def test_a_filter_matching_no_run_is_bad_input_naming_what_there_is(root, capsys):
    assert main(["history", "--artifact-root", str(root), "--dag-id", DAG, "--model", "big_cnn"]) == 2
    err = capsys.readouterr().err
    assert err == f"ERROR: --model 'big_cnn': no analysed run of DAG {DAG!r} has it (have: small_cnn, tiny_mlp)\n"


@pytest.mark.filterwarnings("error")  # matplotlib warns on an axis with nothing to show
def test_a_dag_without_analysed_runs_or_figures_gets_a_page_that_says_so(tmp_path):
    _run(tmp_path, "r1", None)
    history, page = write_history(str(tmp_path), DAG)
    assert history.runs == [] and "No run of this DAG has been analysed yet" in page.read_text()

    _run(tmp_path, "r2", {})  # the oldest metrics.json: none of the figures
    history, page = write_history(str(tmp_path), DAG)
    html_text = page.read_text()
    assert len(history.runs) == 1 and len(_images(html_text)) == 4
    assert "No run of this DAG" not in html_text and "<td>–</td>" in html_text


def test_the_analyze_stage_refreshes_the_page_and_never_fails_for_it(tmp_path, caplog):
    _run(tmp_path, "r1", _metrics(1, 0.8, "r1"))
    run = RunDir.for_run(str(tmp_path), DAG, "r1")
    assert refresh_history(run, DAG, "r1") == tmp_path / DAG / "history.html"
    assert refresh_history(run, "other_dag", "r1") is None  # not in its DAG's folder: left alone

    (tmp_path / DAG / "history.html").unlink()
    (tmp_path / DAG / "history.html" / "in-the-way").mkdir(parents=True)  # the page cannot replace a folder
    with caplog.at_level(logging.WARNING):
        assert refresh_history(run, DAG, "r1") is None
    assert any("could not write the DAG's history page" in m for m in caplog.messages)
