"""Tests of the analyze stage: event parsing (against files TensorFlow wrote), evaluation, report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.analyze import events
from pipelines.analyze.evaluate import confusion_metrics, iter_holdout
from pipelines.analyze.report import SECTIONS, build_report
from pipelines.core.stages import StageContext, resolve
from pipelines.errors import DataError
from pipelines.spec import load_spec
from pipelines.stores.rundir import RunDir, write_json

pytestmark = pytest.mark.trainer

tf = pytest.importorskip("tensorflow")
pa = pytest.importorskip("pyarrow")

FEATURE_SHAPE = [4, 4, 1]
NUM_CLASSES = 3


def write_tf_events(logdir: Path, scalars: dict[str, list[tuple[int, float]]], dtype=None) -> Path:
    """Write scalars with the real TF2 summary API; returns the event file it created."""
    before = set(logdir.glob("events.out.tfevents.*")) if logdir.exists() else set()
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        for tag, points in scalars.items():
            for step, value in points:
                tf.summary.scalar(tag, tf.constant(value, dtype=dtype or tf.float32), step=step)
        tf.summary.histogram("other/histogram", [1.0, 2.0, 3.0], step=0)  # not a scalar
        tf.summary.text("ignored/text", "hello", step=0)
    writer.close()
    (new,) = set(logdir.glob("events.out.tfevents.*")) - before
    return new


# ------------------------------------------------------------------------------------- events


def test_crc32c_matches_the_standard_check_value():
    assert events.crc32c(b"123456789") == 0xE3069283
    assert events.crc32c(b"") == 0


def test_reads_tf2_tensor_scalars_across_files_and_tags(tmp_path):
    logdir = tmp_path / "events"
    write_tf_events(
        logdir, {"train/loss": [(s, 1.0 / (s + 1)) for s in range(5)], "rank0/batch": [(0, 24.0)]}
    )
    write_tf_events(logdir, {"train/loss": [(s, 0.1) for s in range(5, 8)]})
    write_tf_events(logdir / "sub", {"train/learning_rate": [(3, 0.125)]}, dtype=tf.float64)

    scalars = events.read_scalars(logdir)

    assert set(scalars) == {"train/loss", "rank0/batch", "train/learning_rate"}
    loss = scalars["train/loss"]
    assert [p[0] for p in loss] == list(range(8))
    np.testing.assert_allclose([p[2] for p in loss], [1.0, 0.5, 1 / 3, 0.25, 0.2, 0.1, 0.1, 0.1], rtol=1e-6)
    assert all(p[1] > 1e9 for p in loss)  # wall times in seconds since the epoch
    assert scalars["rank0/batch"] == [(0, pytest.approx(scalars["rank0/batch"][0][1]), 24.0)]
    assert scalars["train/learning_rate"][0][2] == 0.125  # DT_DOUBLE kept exactly


def test_repeated_step_keeps_the_latest_value(tmp_path):
    write_tf_events(tmp_path, {"train/loss": [(0, 5.0), (1, 4.0)]})
    write_tf_events(tmp_path, {"train/loss": [(1, 3.0), (2, 2.0)]})  # resumed run repeats step 1
    assert [(s, v) for s, _, v in events.read_scalars(tmp_path)["train/loss"]] == [
        (0, 5.0),
        (1, 3.0),
        (2, 2.0),
    ]


def test_file_uri_goes_through_pyarrow_and_matches_local(tmp_path):
    write_tf_events(tmp_path, {"a": [(1, 2.0), (2, 3.0)]})
    assert events.read_scalars(tmp_path.as_uri()) == events.read_scalars(tmp_path)
    fs = pa.fs.LocalFileSystem()
    assert events.read_scalars(str(tmp_path), fs=fs)["a"][1][2] == 3.0


@pytest.mark.parametrize("where", ["header", "payload", "crc"])
def test_truncated_tail_is_ignored(tmp_path, where):
    path = write_tf_events(tmp_path / "full", {"train/loss": [(s, float(s)) for s in range(6)]})
    data = path.read_bytes()
    records = list(events.iter_records(data))
    # Cut into the record of step 5 as a killed writer would (dropping the records after it).
    start, payload = next((o, p) for o, p in records if events.parse_event(p)[0] == 5)
    stop = {
        "header": start + 7,
        "payload": start + 12 + len(payload) // 2,
        "crc": start + 12 + len(payload) + 2,
    }
    trunc = tmp_path / "trunc" / path.name
    trunc.parent.mkdir()
    trunc.write_bytes(data[: stop[where]])
    assert [p[0] for p in events.read_scalars(trunc.parent)["train/loss"]] == [0, 1, 2, 3, 4]


def test_corrupt_record_in_the_middle_names_file_and_offset(tmp_path):
    path = write_tf_events(tmp_path, {"train/loss": [(s, float(s)) for s in range(4)]})
    data = bytearray(path.read_bytes())
    offset = [o for o, _ in events.iter_records(bytes(data))][2]
    data[offset + 14] ^= 0xFF  # a byte inside the payload of the third record
    path.write_bytes(bytes(data))
    with pytest.raises(events.EventFileError) as err:
        events.read_scalars(tmp_path)
    assert path.name in str(err.value) and f"offset {offset}" in str(err.value)
    # Without verification the framing still holds and the other records are read.
    assert len(events.read_scalars(tmp_path, verify=False)["train/loss"]) >= 3


def write_tf_histograms(logdir: Path, histograms: dict[str, list[tuple[int, np.ndarray]]], buckets=None) -> Path:
    """Write histograms with the real TF2 ``tf.summary.histogram``; returns the event file."""
    before = set(logdir.glob("events.out.tfevents.*")) if logdir.exists() else set()
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        for tag, points in histograms.items():
            for step, values in points:
                tf.summary.histogram(tag, values, step=step, buckets=buckets)
    writer.close()
    (new,) = set(logdir.glob("events.out.tfevents.*")) - before
    return new


def tf_decoded(path: Path) -> dict[str, list[tuple[int, list]]]:
    """What TensorFlow's own parser finds in an event file: ``tag -> [(step, [k, 3] rows)]``."""
    out: dict[str, list] = {}
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name == "histograms":
                out.setdefault(v.tag, []).append((event.step, tf.make_ndarray(v.tensor).tolist()))
    return out


def test_reads_tf2_histograms_as_tensorflow_decodes_them(tmp_path):
    rng = np.random.default_rng(0)
    kernel = [(s, rng.normal(s, 1.0, (6, 5)).astype(np.float32)) for s in (0, 10, 20)]
    path = write_tf_histograms(tmp_path, {"weights/d/kernel": kernel, "weights/d/bias": [(0, np.zeros(4, np.float32))]})
    write_tf_events(tmp_path, {"train/loss": [(0, 1.0)]})  # scalars (and other/histogram) beside them

    got = events.read_histograms(tmp_path)

    assert list(got) == ["weights/d/kernel", "weights/d/bias", "other/histogram"]  # first-written order
    assert set(events.read_scalars(tmp_path)) == {"train/loss"}
    expected = tf_decoded(path)
    for tag in ("weights/d/kernel", "weights/d/bias"):
        assert [(s, [list(b) for b in buckets]) for s, _, buckets in got[tag]] == expected[tag]
    for (step, values), (s, wall, buckets) in zip(kernel, got["weights/d/kernel"], strict=True):
        assert s == step and wall > 1e9 and len(buckets) == 30  # TF 2.15's default bucket count
        assert sum(c for _, _, c in buckets) == 30
        assert (buckets[0][0], buckets[-1][1]) == pytest.approx((values.min(), values.max()))
    assert sum(c for _, _, c in got["other/histogram"][0][2]) == 3


def test_histograms_keep_the_latest_per_step_and_read_through_pyarrow(tmp_path):
    write_tf_histograms(tmp_path, {"w": [(0, np.ones(3)), (5, np.ones(3))]}, buckets=4)
    write_tf_histograms(tmp_path, {"w": [(5, np.full(6, 2.0)), (9, np.ones(2))]}, buckets=4)  # a resume
    got = events.read_histograms(tmp_path)["w"]
    assert [(s, sum(c for *_, c in b), len(b)) for s, _, b in got] == [(0, 3, 4), (5, 6, 4), (9, 2, 4)]
    assert got[1][2][-1] == (2.0, 2.0, 6.0)  # the constant's count sits in the last bucket
    assert events.read_histograms(tmp_path.as_uri()) == events.read_histograms(tmp_path)
    assert events.read_events(str(tmp_path), fs=pa.fs.LocalFileSystem()).histograms == events.read_histograms(tmp_path)


def test_reads_tf1_histogram_protos(tmp_path):
    histo = tf.compat.v1.HistogramProto(min=-1.0, max=4.0, num=6, bucket_limit=[0.0, 2.0, 1.7e308], bucket=[1, 3, 2])
    summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag="legacy", histo=histo)])
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=3)
    writer.close()
    assert events.read_histograms(tmp_path)["legacy"][0][::2] == (3, [(-1.0, 0.0, 1.0), (0.0, 2.0, 3.0), (2.0, 4.0, 2.0)])


def test_malformed_histogram_names_the_tag_file_and_offset(tmp_path):
    metadata = tf.compat.v1.SummaryMetadata(plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="histograms"))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.write("bad/hist", tf.constant([1.0, 2.0]), step=1, metadata=metadata)
    writer.close()
    with pytest.raises(events.EventFileError, match=r"events\.out\.tfevents.*offset \d+: histogram 'bad/hist'.*\[2\]"):
        events.read_histograms(tmp_path)


def test_missing_event_folder_raises_naming_it(tmp_path):
    with pytest.raises(events.EventsNotFoundError, match="nowhere"):
        events.read_scalars(tmp_path / "nowhere")


def test_events_module_does_not_import_tensorflow(tmp_path):
    write_tf_events(tmp_path, {"x": [(0, 1.0)]})
    code = (
        "import sys, pipelines.analyze.events as e; "
        f"s, h = e.read_events({str(tmp_path)!r}); assert s['x'][0][2] == 1.0, s; "
        "assert sum(c for *_, c in h['other/histogram'][0][2]) == 3, h; "
        "assert 'tensorflow' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ------------------------------------------------------------------------------ synthetic run


def make_holdout(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Features where class c has a bright c-th third of the image, plus noise (some mistakes)."""
    labels = rng.integers(0, NUM_CLASSES, n).astype(np.int32)
    x = rng.normal(0, 1.5, (n, 16)).astype(np.float32)
    for c in range(NUM_CLASSES):
        x[labels == c, c * 5 : c * 5 + 5] += 1.0
    return x, labels


def write_shard(path: Path, x: np.ndarray, y: np.ndarray) -> str:
    features = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), x.shape[1])
    table = pa.table({"features": features, "label": pa.array(y, pa.int32())})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return str(path)


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
    """A finished run: held-out shards, a saved model, event files and every upstream result."""
    rd = RunDir(tmp_path_factory.mktemp("run"))
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


def images(html_text: str) -> list[bytes]:
    import base64

    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', html_text)]


def test_full_stage_writes_report_and_metrics(run_dir):
    rd, expected = run_dir
    result = resolve("analyze")(spec(), rd, StageContext(fresh=True))

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


# ------------------------------------------------------------------------- report / evaluate


def test_report_sections_without_inputs_say_so():
    lr_fixed = {"learning_rate": 0.1, "method": "fixed", "curve": {"lr": [], "loss": []}}
    html_text = build_report(train={}, scalars={}, metrics={}, lr_search=lr_fixed)
    for heading in SECTIONS:
        assert f"<h2>{heading}</h2>" in html_text
    assert "learning rate was fixed at 0.1" in html_text
    assert "No train/loss" in html_text and "No held-out evaluation" in html_text
    assert "No weight histograms (weights/* tags) in the event files" in html_text
    assert "<img" not in html_text


def test_report_explains_the_range_tests_choice_and_scales_its_plot(monkeypatch):
    import numpy as np

    import pipelines.analyze.report as report

    lrs = list(np.geomspace(1e-4, 3.0, 30))
    smoothed = [2.3 - 1.5 / (1 + (1e-2 / lr) ** 2) for lr in lrs[:-3]] + [3.0, 9.0, 40.0]
    result = {
        "learning_rate": 0.02, "lr_range": [1e-3, 0.05], "global_batch": 64, "steps": 30, "ranks": 2,
        "stopped": "diverged at lr 3", "method": "range_test+confirm", "diverged_at": 3.0,
        "reason": "min-loss rate 0.05 of the poly4 fit; x0.5 ended lowest",
        "curve": {"lr": lrs, "loss": smoothed, "smoothed": smoothed},
        "candidates": [{"lr": 0.025, "factor": 0.5, "trial_loss": 0.81}, {"lr": 0.05, "factor": 1.0, "trial_loss": 0.9},
                       {"lr": 0.1, "factor": 2.0, "trial_loss": None}],
        "references": {"fastai_valley": 0.004, "lightning": 0.01},
        "fits": {"poly": {"degree": 2, "coefficients": [0.5, 1.0, 1.2]}, "log_fit": {"a": 0.2, "b": -0.5},
                 "points": {"x": [-4.0, -1.3]}},
    }
    limits = []
    real_img = report._img
    monkeypatch.setattr(report, "_img", lambda fig, alt: limits.append(fig.axes[0].get_ylim()) or real_img(fig, alt))
    html_text = report._lr_test(result)
    assert "Why: min-loss rate 0.05 of the poly4 fit; x0.5 ended lowest." in html_text
    assert html_text.count("<tr>") == 4 and "0.81" in html_text  # a header and one row per candidate
    (low, high), = limits
    assert high < 3.0 and low < min(smoothed)  # the divergence spike is off the chart, the minimum on it


def test_weight_section_draws_the_first_variables_and_their_quantiles(monkeypatch):
    import pipelines.analyze.report as report

    assert report._quantiles([(0.0, 1.0, 1), (1.0, 2.0, 1), (2.0, 3.0, 2)], [0, 0.5, 1]) == [0.0, 2.0, 3.0]
    assert report._quantiles([(5.0, 6.0, 0), (0.5, 0.5, 4)], [0, 0.25, 1]) == [0.5, 0.5, 0.5]  # a constant
    assert report._quantiles([(0.0, 1.0, 0)], [0.5]) is None
    histograms = {
        f"weights/layer{i}/kernel": [(s, 0.0, [(-1.0 - s, 0.0, 5.0), (0.0, 1.0 + s, 5.0)]) for s in (0, 10, 20, 30, 40)]
        for i in range(10)
    }
    histograms["weights/layer0/bias"] = [(0, 0.0, [(0.0, 0.0, 4.0)])]
    histograms["other/activations"] = histograms["weights/layer1/kernel"]
    figures = []
    real_img = report._img
    monkeypatch.setattr(report, "_img", lambda fig, alt: figures.append(fig) or real_img(fig, alt))
    html_text = report._weights(histograms)
    (fig,) = figures
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0::2] == [f"layer{i}/kernel (10 values)" for i in range(8)]  # first 8 of 11, in order
    assert "first 8 of 11 weight variables" in html_text and "5 step(s), 0 to 40" in html_text
    steps = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert steps == ["step 0", "step 10", "step 30", "step 40"]  # four of five steps, ends included
    assert "<img" in report._weights({"weights/layer0/bias": [(0, 0.0, [(0.0, 0.0, 4.0)])]})
    assert "No weight histograms" in report._weights({"other/activations": histograms["other/activations"]})
    assert "No activation histograms" in html_text  # these weights came without activations


def test_activation_histograms_are_drawn_under_the_weights(monkeypatch):
    import pipelines.analyze.report as report

    points = [(s, 0.0, [(-1.0, 0.0, 3.0), (0.0, 2.0 + s, 5.0)]) for s in (0, 20)]
    figures = []
    real_img = report._img
    monkeypatch.setattr(report, "_img", lambda fig, alt: figures.append((alt, fig)) or real_img(fig, alt))
    html_text = report._weights({"weights/dense/kernel": points, "activations/dense": points, "activations/logits": points})
    assert [alt for alt, _ in figures] == ["weight distributions over training", "activation distributions over training"]
    activations = figures[1][1]
    assert [ax.get_title() for ax in activations.axes][0::2] == ["dense (8 values)", "logits (8 values)"]
    assert activations.axes[0].get_ylabel() == "activation"
    assert "fixed batch of training rows" in html_text


def test_per_rank_section_pieces():
    from pipelines.analyze.report import _per_rank, _rank_series_plot, _rank_table

    ranks = [
        {"rank": 0, "device": "<fast>", "batch": 40, "samples_per_sec": 200.0, "balance_efficiency": 0.9},
        {"rank": 1, "device": "slow", "batch": 24},
    ]
    table = _rank_table(ranks)
    assert table.count("<tr>") == 3  # the header and one row per rank
    assert "&lt;fast&gt;" in table and "<fast>" not in table
    assert "<td>90.0%</td>" in table and "<td>–</td>" in table  # efficiency; a missing figure
    assert _rank_series_plot({"train/loss": [(0, 0.0, 1.0)]}) == ""  # no per-rank scalars
    assert _rank_series_plot({"rank1/batch": [(0, 0.0, 24.0)]}).count("<img") == 1
    assert _per_rank({"ranks": ranks}, {}).count("<img") == 1  # the bars, then the table
    assert "lists no ranks" in _per_rank({}, {"rank0/batch": [(0, 0.0, 40.0)]})


def test_time_bars_stack_every_part_of_each_ranks_loop(monkeypatch):
    import pipelines.analyze.report as report

    ranks = [
        {"rank": 0, "device": "fast", "batch": 40, "compute_s": 8.0, "wait_s": 0.5, "input_wait_s": 0.2, "other_s": 0.8},
        {"rank": 1, "device": "slow", "batch": 24, "compute_s": 9.0, "wait_s": 0.4, "input_wait_s": 0.1, "other_s": 0.0},
    ]
    figures = []
    real_img = report._img
    monkeypatch.setattr(report, "_img", lambda fig, alt: figures.append(fig) or real_img(fig, alt))
    html_text = report._per_rank({"ranks": ranks, "steady_seconds": 9.5}, {})
    ax = figures[0].axes[0]
    tops = {round(p.get_x() + p.get_width() / 2): p.get_y() + p.get_height() for p in ax.patches}
    assert tops == pytest.approx({0: 9.5, 1: 9.5})  # both ranks' parts reach the same loop wall time
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "compute", "allreduce wait", "input wait", "other (host)", "loop wall time"}
    assert "<th>Other s</th>" in html_text and "<td>0.8</td>" in html_text


def test_balance_section_says_what_the_figure_is():
    from pipelines.analyze.report import _balance

    text = _balance({"steady_seconds": 12.5}, {}, {"balance_efficiency": 0.8432})
    assert "84.3% of the 12.5 s steady loop" in text and "spent computing" in text
    assert "No balance/efficiency scalars" in text


def test_balance_efficiency_metric_is_the_train_results():
    from pipelines.analyze.stage import derived_metrics

    ranks = [{"balance_efficiency": 0.9}, {"balance_efficiency": 0.8}]
    assert derived_metrics({"balance_efficiency": 0.7, "ranks": ranks}, None)["balance_efficiency"] == 0.7
    assert derived_metrics({"ranks": ranks}, None)["balance_efficiency"] == pytest.approx(0.85)  # an older result
    assert derived_metrics({}, None)["balance_efficiency"] is None


def test_confusion_metrics_and_empty_class():
    m = confusion_metrics([[3, 1, 0], [0, 0, 0], [1, 0, 5]])
    assert m["accuracy"] == pytest.approx(0.8) and m["rows"] == 10
    assert m["per_class_accuracy"] == [0.75, None, pytest.approx(5 / 6)]


def test_holdout_shard_with_wrong_feature_size_names_the_file(tmp_path):
    path = write_shard(tmp_path / "bad.arrow", np.zeros((3, 9), np.float32), np.zeros(3, np.int32))
    with pytest.raises(DataError, match="bad.arrow"):
        list(iter_holdout([path], feature_size=16))


def test_report_shows_the_run_time_part_by_part_and_earlier_runs():
    timing = {"parts": {"startup": 0.1, "calibration": 1.2, "tracing": 2.0, "steps": 5.0, "checkpoints": 0.1, "other": 0.4},
              "uncorrected": {}, "corrections": {"runs": 3, "parts": {"steps": {"factor": 1.5, "per_unit": 0.002},
                                                                   "other": {"factor": 0.0, "per_unit": 0.4}}}}
    estimate = {"plan": {"predicted_total_s": 8.8, "timing": timing, "ranks": []},
                "profiles": {"fast": {"fixed_s": 0.002, "per_sample_s": 1e-5, "max_batch": 900,
                                      "source": "predicted by the bank's 'flops' law"}}}
    learned = {"recorded": True, "parts": {"steps": {"actual": 5.5}, "tracing": {"actual": 1.9}},
               "earlier": [{"run": "dag/r1/k", "predicted_s": 10.0, "actual_s": 8.0, "error": 0.25}]}
    html_text = build_report(train={"train_seconds": 9.0}, scalars={}, metrics={"prediction_error": -0.02},
                             estimate=estimate, learned=learned)
    section = html_text.split('id="predicted-vs-actual-run-time"')[1].split("</section>")[0]
    assert "Part by part" in section and "<td>+ 0.4 s</td>" in section
    assert '<td class="l">steps</td><td>5</td><td>5.5</td><td>× 1.5 + 2 ms per step</td>' in section
    assert "not measured" in section  # startup: no actual in this record
    assert "latest 3 run(s) on this pool" in section and "dag/r1/k" in section and "25.0%" in section
    assert "predicted by the bank&#x27;s &#x27;flops&#x27; law" in section
    unlearned = build_report(train={"train_seconds": 9.0}, scalars={}, metrics={}, estimate=estimate,
                             learned={"recorded": False, "why_not": "a resumed run", "earlier": []})
    assert "This run was not added to the profile bank: a resumed run." in unlearned


# --------------------------------------------------------------------------- parameter server

PS_WORKERS = [  # worker 1 (slow) was lost; worker 2 never had an update dropped
    {"worker": 0, "device": "fast", "updates": 120, "applied": 118, "dropped": 2, "samples": 7680,
     "mean_staleness": 0.4, "max_staleness": 3},
    {"worker": 1, "device": "slow", "updates": 40, "applied": 37, "dropped": 3, "samples": 2560,
     "mean_staleness": 1.9, "max_staleness": 4},
    {"worker": 2, "device": "fast", "updates": 100, "applied": 100, "dropped": 0, "samples": 6400,
     "mean_staleness": 0.6, "max_staleness": 4},
]
PS_HISTOGRAM = [150, 60, 30, 10, 5]  # the 255 applied updates by staleness


def ps_train(rd: RunDir, mode: str = "bounded") -> dict:
    """A parameter-server train result, as pipelines.train.ps writes it (its ranks are the workers)."""
    ranks = [{"rank": w["worker"], "device": w["device"], "batch": 64, "samples_per_sec": 640.0 - 200 * w["worker"],
              "compute_s": 8.0, "wait_s": 1.5, "input_wait_s": 0.0, "other_s": 0.5, "balance_efficiency": 0.8}
             for w in PS_WORKERS]
    return {
        "strategy": "parameter_server", "updates": 260, "global_batch": 192, "epochs": 2, "steps": 255,
        "final_loss": 0.4, "train_seconds": 15.0, "steady_seconds": 10.0, "samples_per_sec": 1100.0,
        "learning_rate": 0.05, "balance_efficiency": 0.8, "ranks": ranks, "rebalance_events": [],
        "parameter_server": {
            "update_mode": mode, "combiner": "plain", "max_staleness": 4, "parameter_servers": 1,
            "workers": PS_WORKERS, "staleness_histogram": PS_HISTOGRAM, "max_staleness_seen": 4,
            "dropped_updates": 5, "lost_workers": [{"worker": 1, "device": "slow", "last_update_s": 12.3}],
            "updates_file": str(rd.root / "train" / "updates.jsonl"),
        },
        "saved_model": str(rd.root / "train" / "saved_model"), "events_dir": str(rd.root / "train" / "events"),
        "input_key": "t-ps",
    }  # fmt: skip


def ps_updates() -> list[dict]:
    """updates.jsonl's rows, one per update in PS_WORKERS, dropped ones above the bound."""
    rows = []
    for w in PS_WORKERS:
        last = 12.3 if w["worker"] == 1 else 15.0
        for n in range(w["updates"]):
            dropped = n >= w["updates"] - w["dropped"]
            rows.append({"worker": w["worker"], "staleness": 5 if dropped else n % 4, "applied": not dropped,
                         "samples": 64, "loss": 0.5, "t": round(last * (n + 1) / w["updates"], 3)})
    rows.sort(key=lambda r: r["t"])
    return [{"i": i, **r, "version": i} for i, r in enumerate(rows)]


def write_updates(path: Path, rows: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


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


def capture_images(monkeypatch) -> dict[str, object]:
    """The report's figures by their alt text, as it draws them."""
    import pipelines.analyze.report as report

    figures: dict[str, object] = {}
    real_img = report._img
    monkeypatch.setattr(report, "_img", lambda fig, alt: (figures.setdefault(alt, fig), real_img(fig, alt))[1])
    return figures


def section(html_text: str, slug: str) -> str:
    return re.search(rf'<section id="{slug}">(.*?)</section>', html_text, re.S).group(1)


def test_parameter_server_run_gets_its_section_charts_and_result_fields(ps_run_dir, tmp_path, monkeypatch):
    from pipelines.analyze.report import PS_SECTIONS

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
    assert "Update mode <b>bounded</b>" in ps and "more than 4 versions old is dropped" in ps
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
    assert bound.get_xdata()[0] == 4.5 and bound.get_label() == "bound: at most 4"
    timeline = figures["updates over time per worker"].axes[0]
    assert [t.get_text() for t in timeline.get_legend().get_texts()] == ["worker 0", "worker 1", "worker 2"]
    assert len(images(html_text)) >= 8


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


def test_parameter_server_section_for_async_mode_without_an_updates_file(monkeypatch):
    figures = capture_images(monkeypatch)
    train = ps_train(RunDir("/nowhere"), mode="async")
    train["parameter_server"]["lost_workers"] = []
    html_text = build_report(train=train, scalars={}, metrics={})
    ps = section(html_text, "parameter-server")
    assert "Update mode <b>async</b>: each update is applied as it arrives" in ps
    assert not figures["staleness histogram"].axes[0].get_lines()  # no bound to mark
    assert "No worker was lost." in ps and "lost after" not in ps
    assert "No updates file (/nowhere/train/updates.jsonl)" in ps
    assert "updates over time per worker" not in figures

    mismatch = build_report(train=train, scalars={}, metrics={}, updates=ps_updates()[:100])
    assert "The updates file holds 100 updates; the train result counts 260." in mismatch
    older = build_report(train={"strategy": "parameter_server", "ranks": []}, scalars={}, metrics={})
    assert "no parameter_server figures" in section(older, "parameter-server")


def test_a_long_staleness_histogram_groups_its_stalest_rows():
    from pipelines.analyze.report import STALENESS_ROWS, _staleness_rows

    rows = _staleness_rows([1] * 40)
    assert len(rows) == STALENESS_ROWS and rows[-1][:2] == (f"{STALENESS_ROWS - 1} to 39", 40 - STALENESS_ROWS + 1)
    assert [r[0] for r in _staleness_rows([3, 0, 1])] == ["0", "2"]  # empty values left out


def test_updates_file_errors_name_the_file_line_and_field(tmp_path):
    from pipelines.analyze.updates import check_parameter_server, read_updates

    path = tmp_path / "updates.jsonl"
    rows = ps_updates()[:3]
    write_updates(path, rows, tail='{"i": 3, "worker": 0, "staleness"')
    assert read_updates(path) == rows  # a last line cut off mid-write is left out
    assert read_updates(path.as_uri()) == rows
    write_updates(path, [rows[0], {**rows[1], "staleness": "2"}, rows[2]])
    with pytest.raises(DataError, match=r"updates.jsonl line 2: field 'staleness' must be an integer \(got '2'\)"):
        read_updates(path)
    path.write_text(json.dumps(rows[0]) + "\nnot json\n" + json.dumps(rows[1]) + "\n")
    with pytest.raises(DataError, match="updates.jsonl line 2: not a JSON object"):
        read_updates(path)
    with pytest.raises(FileNotFoundError):
        read_updates(tmp_path / "missing.jsonl")
    bad = {"parameter_server": {"staleness_histogram": [3, -1]}}
    with pytest.raises(DataError, match=r"train/result.json: field parameter_server.staleness_histogram"):
        check_parameter_server(bad, "train/result.json")
    with pytest.raises(DataError, match=r"parameter_server.workers\[0\].worker must be an integer"):
        check_parameter_server({"parameter_server": {"workers": [{"device": "fast"}]}}, "train result")


def test_only_horovod_runs_are_recorded_in_the_profile_bank(tmp_path):
    from pipelines.stores.profile_bank import ProfileBank
    from pipelines.stores.run_records import PARTS, record_run

    history = [{"step": s, "seconds": 1.0, "batches": [40, 24], "compute_s": [0.8, 0.8]} for s in (10, 20, 30, 40)]
    summary = {"timings": {"startup_s": 0.2, "calibration_s": 1.0}, "history": history, "resumed_from_step": 0,
               "loop_seconds": 4.0, "checkpoint_seconds": 0.1, "train_seconds": 6.0, "steps": 40,
               "ranks": [{"device": "fast"}, {"device": "slow"}]}
    parts = dict.fromkeys(PARTS, 1.0)
    estimate = {"plan": {"ranks": [{"device": "fast", "batch": 40}, {"device": "slow", "batch": 24}], "global_batch": 64,
                         "predicted_total_s": 6.0, "timing": {"parts": parts, "uncorrected": parts}},
                "pool_key": "pool-1", "model_key": "m", "device_keys": {"fast": "kf", "slow": "ks"},
                "model": {"name": "job", "params": 1000, "num_layers": 3, "input_size": 16,
                          "train_flops_per_sample": 1e4, "activation_bytes_per_sample": 100.0}}
    bank = tmp_path / "bank"
    ps = record_run(str(bank), estimate, {**summary, "strategy": "parameter_server"}, "dag/ps/k", "sgd")
    assert ps["recorded"] is False and ps["step_rows_added"] == 0 and ps["parts"] is None
    assert ps["why_not"] == "a parameter_server run: the estimator learns only from horovod runs' parts and steps"
    assert not bank.exists()
    older = record_run(str(bank), estimate, summary, "dag/old/k", "sgd")  # no strategy key: a Horovod run
    horovod = record_run(str(bank), estimate, {**summary, "strategy": "horovod"}, "dag/hvd/k", "sgd")
    assert older["recorded"] and horovod["recorded"] and horovod["step_rows_added"] == 2
    assert sorted(r["run"] for r in ProfileBank(str(bank)).runs()) == ["dag/hvd/k", "dag/old/k"]
