"""The analyze stage (pipelines.analyze.stage) on a synthetic finished run: report, metrics,
idempotence, and a parameter-server run's report and result fields."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from analyze.figure_checks import misplaced_text
from analyze.synthetic import (
    FEATURE_SHAPE,
    NUM_CLASSES,
    PS_HISTOGRAM,
    PS_WORKERS,
    capture_images,
    images,
    make_holdout,
    ps_train,
    ps_updates,
    section,
    write_shard,
    write_tf_events,
    write_tf_histograms,
    write_updates,
)
from pipelines.analyze.report import PS_SECTIONS, SECTIONS
from pipelines.core.stages import StageContext, resolve
from pipelines.spec import load_spec
from pipelines.stores.rundir import RunDir, write_json

pytestmark = pytest.mark.trainer

tf = pytest.importorskip("tensorflow")
pa = pytest.importorskip("pyarrow")


def _export_model(rd: RunDir, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A linear model that reads the bright third of the image, exported as ``train/saved_model``;
    returns the confusion matrix it must give on ``(x, y)``."""
    weights = np.zeros((16, NUM_CLASSES), np.float32)
    for c in range(NUM_CLASSES):
        weights[c * 5 : c * 5 + 5, c] = 1.0
    bias = np.array([0.0, 0.3, -0.2], np.float32)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=FEATURE_SHAPE),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(NUM_CLASSES),
        ]
    )
    model.layers[-1].set_weights([weights, bias])
    model.export(str(rd.stage("train") / "saved_model"))
    pred = (x @ weights + bias).argmax(axis=1)
    expected = np.zeros((NUM_CLASSES, NUM_CLASSES), int)
    np.add.at(expected, (y, pred), 1)
    return expected


def _write_train_events(rd: RunDir) -> None:
    rng = np.random.default_rng(1)
    write_tf_histograms(
        rd.stage("train") / "events",
        {
            "weights/dense/kernel": [(s, rng.normal(0, 1.0 / (1 + s / 10), (16, 3))) for s in (0, 20, 40)],
            "weights/dense/bias": [(s, np.full(3, s / 100)) for s in (0, 20, 40)],
        },
    )
    write_tf_events(
        rd.stage("train") / "events",
        {
            "train/loss": [(s, 2.0 / (s + 1)) for s in range(0, 50, 10)],
            "train/accuracy": [(s, 0.3 + s / 100) for s in range(0, 50, 10)],
            "train/learning_rate": [(s, min(0.1, 0.02 * (s / 10 + 1))) for s in range(0, 50, 10)],
            "balance/efficiency": [(s, 0.8 + s / 500) for s in range(0, 50, 10)],
            **{
                f"rank{r}/samples_per_sec": [(s, 100.0 * (2 - r) + s) for s in range(0, 50, 10)]
                for r in range(2)
            },
            **{f"rank{r}/batch": [(s, 40.0 - 16 * r) for s in range(0, 50, 10)] for r in range(2)},
        },
    )


def _results(rd: RunDir, holdout_shards: list[str]) -> dict[str, dict]:
    """The upstream stages' results of the synthetic run."""
    return {
        "preload": {
            "train_shards": [], "holdout_shards": holdout_shards, "rows_train": 500, "rows_holdout": 50,
            "num_classes": NUM_CLASSES, "feature_shape": FEATURE_SHAPE, "class_counts": {"0": 170, "1": 160, "2": 170},
            "partitions": ["2026-01-01"], "input_key": "p1",
        },
        "estimate": {"plan": {"predicted_total_s": 12.0, "ranks": [
            {"rank": 0, "device": "fast", "batch": 40, "samples_per_sec": 210.0},
            {"rank": 1, "device": "slow", "batch": 24, "samples_per_sec": 90.0}]}, "input_key": "e1"},
        "lr_search": {"learning_rate": 0.05, "lr_range": [0.01, 0.1], "global_batch": 64, "steps": 6,
                      "curve": {"lr": [1e-4, 1e-3, 1e-2, 1e-1, 1.0, 3.0], "loss": [1.1, 1.08, 0.9, 0.7, 1.5, 9.0],
                                "smoothed": [1.1, 1.09, 0.99, 0.85, 1.1, 4.0]},
                      "diverged_at": 3.0, "method": "range_test", "input_key": "l1"},
        "train": {
            "global_batch": 64, "epochs": 2, "steps": 50, "final_loss": 0.4, "train_seconds": 10.0,
            "samples_per_sec": 320.0, "learning_rate": 0.05,
            "ranks": [
                {"rank": 0, "device": "fast", "batch": 40, "samples_per_sec": 200.0, "compute_s": 8.0,
                 "wait_s": 1.0, "input_wait_s": 0.2, "balance_efficiency": 0.9},
                {"rank": 1, "device": "slow", "batch": 24, "samples_per_sec": 120.0, "compute_s": 9.0,
                 "wait_s": 0.3, "input_wait_s": 0.1, "balance_efficiency": 0.8},
            ],
            "rebalance_events": [{"step": 20, "epoch": 1, "old": [40, 24], "new": [42, 22], "reason": "<script>drift</script>"}],
            "saved_model": str(rd.root / "train" / "saved_model"), "events_dir": str(rd.root / "train" / "events"),
            "input_key": "t1",
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> tuple[RunDir, dict]:
    """A finished run: held-out shards, a saved model, event files and every upstream result, in its
    place under an artifact root (``dag/run-1``)."""
    rd = RunDir.for_run(str(tmp_path_factory.mktemp("artifacts")), "dag", "run-1")
    x, y = make_holdout(50, np.random.default_rng(0))
    shards = [
        write_shard(rd.stage("preload") / f"holdout-{i}.arrow", x[s], y[s])
        for i, s in enumerate((slice(0, 30), slice(30, 50)))
    ]
    expected = _export_model(rd, x, y)
    _write_train_events(rd)
    for stage, result in _results(rd, shards).items():
        write_json(rd.result_path(stage), result)
    return rd, {"confusion": expected, "x": x, "y": y}


def spec():
    return load_spec(
        {"dataset": {"uri": "/data", "feature_shape": FEATURE_SHAPE, "num_classes": NUM_CLASSES}}
    )


def test_full_stage_writes_report_and_metrics(run_dir):
    rd, expected = run_dir
    result = resolve("analyze")(spec(), rd, StageContext("dag", "run-1", fresh=True))

    confusion = expected["confusion"]
    accuracy = np.trace(confusion) / confusion.sum()
    assert 0.5 < accuracy < 1.0  # the fixture makes some mistakes, so this checks the real predictions
    assert result["holdout_accuracy"] == pytest.approx(accuracy)
    assert result["per_class_accuracy"] == pytest.approx(list(np.diag(confusion) / confusion.sum(axis=1)))
    assert result["balance_efficiency"] == pytest.approx(0.85)
    assert result["prediction_error"] == pytest.approx(0.2)
    assert (result["predicted_total_s"], result["actual_train_s"], result["samples_per_sec"]) == (
        12.0,
        10.0,
        320.0,
    )
    assert result["input_key"]

    metrics = json.loads(Path(result["metrics"]).read_text())
    assert metrics["holdout_confusion"] == confusion.tolist() and metrics["holdout_rows"] == 50
    assert metrics["last_scalars"]["train/loss"] == pytest.approx(2.0 / 41)

    html_text = Path(result["report"]).read_text()
    for heading in SECTIONS:
        assert f"<h2>{heading}</h2>" in html_text
    assert f"{100 * accuracy:.1f}%" in html_text
    assert "<script>" not in html_text and "&lt;script&gt;drift" in html_text
    # every section had its inputs but the model versions' (this run published nothing)
    assert html_text.count('class="missing"') == 1 and "Nothing was published" in html_text
    pngs = images(html_text)
    assert len(pngs) >= 9 and all(p.startswith(b"\x89PNG") for p in pngs)
    weights = re.search(r'<section id="weight-distributions">(.*?)</section>', html_text).group(1)
    assert weights.count("<img") == 1 and "3 step(s), 0 to 40" in weights
    # the DAG's history page, with this run in it
    history = (rd.root.parent / "history.html").read_text()
    assert metrics["run_id"] == "run-1" and "<h2>small_cnn on fast:1,slow:1</h2>" in history


def test_stage_is_idempotent_and_handles_missing_optional_results(run_dir):
    rd, _ = run_dir
    first = resolve("analyze")(spec(), rd, StageContext(fresh=True))
    write_json(rd.result_path("analyze"), first)  # what `python -m pipelines analyze` does
    Path(first["report"]).unlink()
    assert resolve("analyze")(spec(), rd, StageContext()) == first
    assert not Path(first["report"]).exists()  # the stored result was returned, nothing recomputed

    for stage in ("lr_search", "estimate"):
        shutil.move(rd.result_path(stage), rd.root / f"{stage}.json.bak")
    try:
        again = resolve("analyze")(spec(), rd, StageContext())
        assert again["input_key"] != first["input_key"]  # inputs changed: recomputed
        html_text = Path(again["report"]).read_text()
        assert "range test did not run" in html_text and "Cannot compare predicted" in html_text
        assert again["prediction_error"] is None and again["holdout_accuracy"] == first["holdout_accuracy"]
    finally:
        for stage in ("lr_search", "estimate"):
            shutil.move(rd.root / f"{stage}.json.bak", rd.result_path(stage))


def test_balance_efficiency_metric_is_the_train_results():
    from pipelines.analyze.stage import derived_metrics

    ranks = [{"balance_efficiency": 0.9}, {"balance_efficiency": 0.8}]
    assert derived_metrics({"balance_efficiency": 0.7, "ranks": ranks}, None)["balance_efficiency"] == 0.7
    assert derived_metrics({"ranks": ranks}, None)["balance_efficiency"] == pytest.approx(0.85)  # an older result
    assert derived_metrics({}, None)["balance_efficiency"] is None


@pytest.fixture()
def ps_run_dir(run_dir, tmp_path) -> RunDir:
    """The finished run of ``run_dir`` as a parameter-server run: its train result and summary.json
    are a PS trainer's, its estimate can be recorded in a profile bank, and updates.jsonl ends in
    a line cut off mid-write."""
    rd = RunDir(tmp_path / "ps-run")
    shutil.copytree(run_dir[0].root, rd.root, ignore=shutil.ignore_patterns("analyze"))
    train = ps_train(rd)
    write_json(rd.result_path("train"), train)
    write_json(rd.root / "train" / "summary.json", {**train, "history": [], "timings": {"startup_s": 1.0, "calibration_s": 1.0}})
    write_updates(rd.root / "train" / "updates.jsonl", ps_updates(), tail='{"i": 260, "wor')
    estimate = json.loads(rd.result_path("estimate").read_text())
    estimate.update(pool_key="pool-1", model_key="m", profile_bank=str(tmp_path / "bank"))
    write_json(rd.result_path("estimate"), estimate)
    return rd


def test_parameter_server_run_gets_its_section_charts_and_result_fields(ps_run_dir, tmp_path, monkeypatch):
    figures = capture_images(monkeypatch)
    result = resolve("analyze")(spec(), ps_run_dir, StageContext(fresh=True))

    assert result["strategy"] == "parameter_server"
    assert result["updates_per_worker"] == [{k: w[k] for k in ("worker", "device", "updates", "applied", "dropped")}
                                            for w in PS_WORKERS]
    assert (result["max_staleness_seen"], result["dropped_updates"]) == (4, 5)
    assert result["lost_workers"] == [{"worker": 1, "device": "slow", "last_update_s": 12.3}]
    assert result["estimator"]["recorded"] is False and "parameter_server run" in result["estimator"]["why_not"]
    assert not (tmp_path / "bank").exists()  # the profile bank was not touched
    metrics = json.loads(Path(result["metrics"]).read_text())
    assert metrics["strategy"] == "parameter_server" and metrics["dropped_updates"] == 5

    html_text = Path(result["report"]).read_text()
    assert re.findall(r"<h2>(.*?)</h2>", html_text) == list(PS_SECTIONS)
    assert "Re-balance events" not in html_text and "allreduce" not in html_text.lower()
    ps = section(html_text, "parameter-server")
    assert [alt for alt in re.findall(r'<img alt="([^"]+)"', ps)] == [
        "updates per worker", "staleness histogram", "updates over time per worker"]
    assert "Update mode <b>bounded</b>" in ps and "more than 4 clock(s)" in ps and "more than 18 versions stale" in ps
    assert "Combiner <b>plain</b>" in ps and "260 updates from 3 worker(s): 255 applied, 5 dropped" in ps
    assert "Lost workers: worker 1 (slow), last update at 12.3 s." in ps and "lost after 12.3 s" in ps
    assert ps.count("to the end") == 2 and "The updates file holds" not in ps  # the cut-off line left out
    for tau, n in enumerate(PS_HISTOGRAM):
        assert f'<td class="l">{tau}</td><td>{n}</td><td>{100 * n / 255:.1f}%</td>' in ps
    summary = section(html_text, "summary")
    assert "<td>parameter server (bounded updates, combiner plain, 1 server(s))</td>" in summary
    assert '<td class="l">Updates applied / dropped</td><td>255 / 5</td>' in summary
    assert '<td class="l">Workers</td><td>3</td>' in summary
    per_worker = section(html_text, "per-worker-throughput-and-waiting")
    assert "<th>Parameter-server wait s</th>" in per_worker and '<th class="l">Worker</th>' in per_worker
    assert "no worker waits for another" in section(html_text, "balance-efficiency")

    bars = figures["updates per worker"].axes[0]
    heights = [p.get_height() for p in bars.patches]
    assert heights == [118, 37, 100, 2, 3, 0]  # applied, then dropped stacked on them
    assert [t.get_text() for t in bars.get_xticklabels()] == ["0\nfast", "1\nslow\n(lost)", "2\nfast"]
    staleness = figures["staleness histogram"].axes[0]
    assert [p.get_height() for p in staleness.patches] == PS_HISTOGRAM
    (bound,) = staleness.get_lines()
    assert bound.get_xdata()[0] == 18.5 and bound.get_label() == "bound (N − 1)(2s + 1): 18"  # 3 workers, s = 4
    timeline = figures["updates over time per worker"].axes[0]
    assert [t.get_text() for t in timeline.get_legend().get_texts()] == ["worker 0", "worker 1", "worker 2"]
    assert len(images(html_text)) >= 8
    for alt, fig in figures.items():
        assert not misplaced_text(fig), (alt, misplaced_text(fig))


def test_horovod_report_has_no_parameter_server_parts(run_dir, monkeypatch):
    figures = capture_images(monkeypatch)
    result = resolve("analyze")(spec(), run_dir[0], StageContext(fresh=True))  # its train result has no strategy

    assert result["strategy"] == "horovod"
    assert not {"updates_per_worker", "max_staleness_seen", "dropped_updates", "lost_workers"} & result.keys()
    html_text = Path(result["report"]).read_text()
    assert re.findall(r"<h2>(.*?)</h2>", html_text) == list(SECTIONS)
    assert "Parameter server" not in html_text and "staleness" not in html_text.lower()
    assert not {"updates per worker", "staleness histogram", "updates over time per worker"} & figures.keys()
    assert "<th>Allreduce wait s</th>" in section(html_text, "per-rank-throughput-and-waiting")
    assert '<td class="l">Ranks</td><td>2</td>' in section(html_text, "summary")
    assert {"weight distributions over training", "confusion matrix"} <= figures.keys()
    for alt, fig in figures.items():
        assert not misplaced_text(fig), (alt, misplaced_text(fig))
