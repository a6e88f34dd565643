"""A synthetic run for the analyze tests: event files written with TensorFlow's summary API,
held-out shards, and a parameter-server run's train result and updates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from pipelines.analyze.report import figures as report_figures
from pipelines.stores.rundir import RunDir

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


def images(html_text: str) -> list[bytes]:
    import base64

    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', html_text)]


PS_WORKERS = [  # worker 1 (slow) was lost; worker 2 never had an update dropped
    {"worker": 0, "device": "fast", "updates": 120, "applied": 118, "dropped": 2, "samples": 7680,
     "mean_staleness": 0.4, "max_staleness": 3, "clock": 120, "max_clock_gap": 4, "clock_wait_s": 2.5, "deferred": 2},
    {"worker": 1, "device": "slow", "updates": 40, "applied": 37, "dropped": 3, "samples": 2560,
     "mean_staleness": 1.9, "max_staleness": 4, "clock": 40, "max_clock_gap": 0, "clock_wait_s": 0.0, "deferred": 0},
    {"worker": 2, "device": "fast", "updates": 100, "applied": 100, "dropped": 0, "samples": 6400,
     "mean_staleness": 0.6, "max_staleness": 4, "clock": 100, "max_clock_gap": 3, "clock_wait_s": 1.0, "deferred": 1},
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
            "clock_bound": 4 if mode == "bounded" else None, "staleness_bound": 18 if mode == "bounded" else None,
            "clocks": [120, 40, 100], "max_clock_gap": 4, "clock_wait_s": 3.5, "deferred_updates": 3,
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


def capture_images(monkeypatch) -> dict[str, object]:
    """The report's figures by their alt text, as it draws them."""
    figures: dict[str, object] = {}
    real_img = report_figures.img
    monkeypatch.setattr(report_figures, "img", lambda fig, alt: (figures.setdefault(alt, fig), real_img(fig, alt))[1])
    return figures


def section(html_text: str, slug: str) -> str:
    return re.search(rf'<section id="{slug}">(.*?)</section>', html_text, re.S).group(1)
