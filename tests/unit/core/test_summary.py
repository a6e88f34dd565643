"""What a command of ``python -m pipelines`` prints for people (pipelines.core.summary): a few lines
per stage and profile-bank command from a realistic result, the full result's place last, a
generic fallback for a result a formatter cannot read, and nothing heavier than the standard
library imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core.summary import SUMMARIES, WIDTH, duration, generic_lines, summary_lines

ROOT = Path(__file__).resolve().parents[3]
RUN = "/art/train_pipeline/manual__2026-01-01"

RESULTS = {
    "preload": {
        "train_shards": [f"/art/_cache/preload/abc/train-{i}.arrow" for i in range(3)],
        "holdout_shards": ["/art/_cache/preload/abc/holdout-0.arrow"], "rows_train": 16200, "rows_holdout": 1800,
        "num_classes": 10, "feature_shape": [28, 28, 1], "class_counts": {"0": 1620}, "feature_mean": 0.1,
        "feature_std": 0.2, "partitions": ["2026-01-01", "2026-01-02"], "sources": ["/data/sample"],
        "content_hash": "0123456789abcdef0123", "cache_hit": True, "input_key": "k",
    },
    "estimate": {
        "model": {"params": 120000, "flops_per_sample": 3.1e6, "name": "small_cnn"},
        "profiles": {"fast": {"fixed_s": 0.01, "per_sample_s": 0.0004, "source": "bank"},
                     "slow": {"fixed_s": 0.02, "per_sample_s": 0.001, "source": "measured"}},
        "calibrated": ["slow"],
        "plan": {"strategy": "horovod", "global_batch": 512,
                 "ranks": [{"rank": 0, "device": "fast", "batch": 366, "samples_per_sec": 2400, "max_batch": 4096},
                           {"rank": 1, "device": "slow", "batch": 146, "samples_per_sec": 960, "max_batch": 4096}],
                 "predicted_step_s": 0.213, "steps_per_epoch": 32, "predicted_loop_s": 27.3,
                 "predicted_total_s": 41.5, "meets_deadline": True, "objective": "time"},
        "strategies": {}, "strategy_reason": "only horovod", "plan_path": f"{RUN}/estimate/plan.json",
        "rows_train": 16200, "input_key": "k",
    },
    "lr_search": {
        "learning_rate": 0.0421, "lr_range": [1e-5, 1.0], "global_batch": 512, "steps": 60, "stopped": "diverged",
        "method": "confirmed", "reason": "the valley's rate trained lowest in its confirmation run",
        "curve": {"lr": [1e-5], "loss": [2.3], "smoothed": [2.3]}, "input_key": "k",
    },
    "train": {
        "global_batch": 512, "epochs": 3, "steps": 96, "final_loss": 0.31234, "final_train_accuracy": 0.9012,
        "train_seconds": 75.2, "loop_seconds": 60.1, "samples_per_sec": 812.4, "balance_efficiency": 0.93,
        "input_wait_fraction": 0.012, "learning_rate": 0.0421, "resumed_from_step": None, "quota_enforced": True,
        "ranks": [{"device": "fast", "batch": 366, "samples_per_sec": 580.2, "balance_efficiency": 0.95},
                  {"device": "slow", "batch": 146, "samples_per_sec": 232.1, "balance_efficiency": 0.91}],
        "stage": "train", "run_dir": RUN, "input_key": "k",
    },
    "publish": {"model": "small_cnn", "version": "v0004", "uri": "/art/models/small_cnn/v0004",
                "store": "/art/models", "published_at": "2026-01-01T10:00:00+00:00", "input_key": "k"},
    "analyze": {
        "report": f"{RUN}/analyze/report.html", "metrics": f"{RUN}/analyze/metrics.json", "holdout_accuracy": 0.91234,
        "balance_efficiency": 0.93, "predicted_total_s": 41.5, "actual_train_s": 75.2, "prediction_error": -0.448,
        "samples_per_sec": 812.4,
        "comparison": {"new": {"version": "v0004", "accuracy": 0.91234}, "promoted": {"version": "v0003", "accuracy": 0.9},
                       "tolerance": 0.01, "promotable": True, "reason": "within the tolerance"},
        "input_key": "k",
    },
    "promote": {"model": "small_cnn", "version": "v0004", "promoted": True, "previous": "v0003", "mode": "auto",
                "reason": "held-out accuracy within the tolerance", "input_key": "k"},
    "profile": {"device": "slow", "rows": 6, "models": 3, "bank": "/art/_profiles", "seconds": 41.0,
                "source": "sweep-1", "size": "tiny", "quota_enforced": False, "cpu_share": 0.4, "threads": 1},
    "fit-bank": {"bank": "/art/_profiles", "device_types": {
        "fast": {"device_key": "a", "rows": 12, "models": 6, "step_model": "affine", "step_cv_mape": 0.052,
                 "memory_model": "linear", "memory_cv_mape": 0.1, "trace_model": None, "laws": {}},
        "slow": {"device_key": "b", "rows": 6, "models": 3, "step_model": "affine", "step_cv_mape": 0.08,
                 "memory_model": None, "memory_cv_mape": None, "trace_model": None, "laws": {}}}},
    "probe-allreduce": {"pool_key": "p", "ranks": 2, "latency_s": 0.00042, "bandwidth_bps": 1.5e9, "sizes": [1],
                        "seconds": [0.1], "bank": "/art/_profiles", "quota_enforced": True},
    "reference-runs": {"bank": "/art/_profiles", "seconds": 300.0, "runs": [
        {"model": "conv_net", "kwargs": {}, "predicted_s": 30.0, "actual_s": 33.0, "error": -0.09, "recorded": True},
        {"model": "tiny_mlp", "kwargs": {}, "predicted_s": 10.0, "actual_s": 9.0, "error": 0.11, "recorded": False}]},
    "generate-data": {"out": "/data/sample", "files": ["a.parquet", "b.parquet"], "rows": 18000, "classes": ["x"]},
    "render": {"out": "/tmp/manifests", "files": ["a.yaml"] * 16, "count": 16},
}

# What each summary must say: the key figures, in the words a person reads.
EXPECTED = {
    "preload": ["16,200 training rows", "1,800 held-out rows", "10 classes", "28x28x1", "from the cache",
                "0123456789ab", "2026-01-01, 2026-01-02"],
    "estimate": ["horovod on 2 ranks", "global batch 512", "fast batch 366, slow batch 146", "0.21 s a step",
                 "32 steps", "41.5 s", "measured slow", "from the profile bank fast", f"{RUN}/estimate/plan.json"],
    "lr_search": ["learning rate 0.0421 at global batch 512 (confirmed)", "1e-05 to 1", "60 steps", "diverged",
                  "the valley's rate"],
    "train": ["3 epochs", "96 steps", "1 min 15 s", "812 samples/s", "final loss 0.3123", "training accuracy 0.9012",
              "balance efficiency 0.93", "input wait 1.2%", "fast batch 366 580/s", "slow batch 146 232/s"],
    "publish": ["small_cnn v0004 at /art/models/small_cnn/v0004", "/art/models"],
    "analyze": ["held-out accuracy 0.9123", "predicted 41.5 s", "actual 1 min 15 s", "-44.8%", "balance efficiency 0.93",
                "promotable (within the tolerance)", f"report: {RUN}/analyze/report.html"],
    "promote": ["small_cnn v0004 is the promoted version (was v0003)", "promotion.mode auto"],
    "profile": ["6 step-time rows of 3 models on slow", "tiny sweep", "41.0 s", "/art/_profiles", "not enforced"],
    "fit-bank": ["2 device types", "fast: 12 rows of 6 models", "affine", "5.2%", "memory linear"],
    "probe-allreduce": ["2 ranks", "0.420 ms", "1,500.0 MB/s"],
    "reference-runs": ["2 runs", "5 min 00 s", "conv_net: predicted 30.0 s, actual 33.0 s (error -9.0%)",
                       "tiny_mlp", "not recorded"],
    "generate-data": ["18,000 rows in 2 files under /data/sample"],
    "render": ["16 manifests in /tmp/manifests"],
}


@pytest.mark.parametrize("command", list(RESULTS))
def test_each_command_says_what_was_done_in_a_few_short_lines(command):
    result = dict(RESULTS[command])
    if command in EXPECTED and command not in SUMMARIES:
        pytest.fail(f"{command} has no summary of its own")
    lines = summary_lines(command, result)
    text = "\n".join(lines)
    assert 2 <= len(lines) <= 10 and all(len(line) <= WIDTH for line in lines), text
    assert lines[0].startswith(f"{command}: "), text
    for words in EXPECTED[command]:
        assert words in text, f"{words!r} not in:\n{text}"
    assert "{" not in text and "input_key" not in text  # no JSON for people


def test_a_stage_names_its_result_file_and_the_json_flag():
    result = {**RESULTS["publish"], "stage": "publish", "run_dir": RUN + "/"}
    assert summary_lines("publish", result)[-1] == f"full result: {RUN}/publish/result.json (--json prints it)"
    assert summary_lines("render", RESULTS["render"])[-1] == "full result: --json prints it as one JSON line"


def test_with_mlflow_tracking_publish_analyze_and_promote_add_its_line():
    mlflow = {"tracking_uri": "http://mlflow:5000", "experiment_id": "4", "run_id": "0a1b", "registered_model": "small_cnn",
              "url": "http://mlflow:5000/#/experiments/4/runs/0a1b"}
    published = summary_lines("publish", {**RESULTS["publish"], "mlflow": {**mlflow, "model_version": "3"}})
    assert published[-2] == "mlflow: run 0a1b, small_cnn version 3 (http://mlflow:5000/#/experiments/4/runs/0a1b)"
    promoted = summary_lines("promote", {**RESULTS["promote"], "mlflow": {**mlflow, "model_version": "3", "alias": "champion"}})
    assert promoted[-2].startswith("mlflow: run 0a1b, small_cnn version 3, alias champion (")
    analyzed = summary_lines("analyze", {**RESULTS["analyze"], "mlflow": {"run_id": "0a1b", "metrics": 12}})
    assert analyzed[-2] == "mlflow: run 0a1b, 12 metrics and the report"
    assert not any(line.startswith("mlflow") for line in summary_lines("publish", RESULTS["publish"]))


def test_a_result_without_some_figures_leaves_out_their_lines():
    fixed = {"learning_rate": 0.01, "method": "fixed", "global_batch": 128, "stage": "lr_search", "run_dir": RUN}
    lines = summary_lines("lr_search", fixed)
    assert lines[0] == "lr_search: learning rate 0.01 at global batch 128 (fixed)" and len(lines) == 2
    not_promoted = {"model": "m", "version": "v0002", "promoted": False, "mode": "never", "reason": "promotion.mode is never"}
    assert summary_lines("promote", not_promoted)[:2] == ["promote: m v0002 not promoted",
                                                          "why: promotion.mode is never (promotion.mode never)"]
    train = {k: v for k, v in RESULTS["train"].items() if k not in ("ranks", "final_train_accuracy")}
    train.update(resumed_from_step=40, quota_enforced=False)
    text = "\n".join(summary_lines("train", train))
    assert "ranks:" not in text and "training accuracy" not in text
    assert "resumed from the checkpoint at step 40" in text and "only pinned" in text
    estimate = {**RESULTS["estimate"], "plan": {**RESULTS["estimate"]["plan"], "meets_deadline": False}}
    assert "misses the deadline" in "\n".join(summary_lines("estimate", estimate))


def test_many_ranks_are_cut_short():
    ranks = [{"device": f"d{i}", "batch": 8, "samples_per_sec": 10.0} for i in range(9)]
    lines = summary_lines("train", {**RESULTS["train"], "ranks": ranks})
    assert any(line.endswith("and 5 more") for line in lines)


def test_an_unreadable_result_falls_back_to_its_plain_values():
    odd = {"something": 3, "nested": {"a": 1}, "input_key": "k", "stage": "analyze", "run_dir": RUN}
    lines = summary_lines("analyze", odd)  # no holdout_accuracy: the analyze formatter cannot read it
    assert lines[0] == "analyze: done" and "  something: 3" in lines and not any("nested" in x for x in lines)
    assert lines[-1].startswith(f"full result: {RUN}/analyze/result.json")
    assert generic_lines("new-command", {f"k{i}": i for i in range(12)})[-1] == "  and 4 more values"


def test_long_free_text_is_cut_but_a_path_never():
    deep = "/very/" + "deep/" * 60 + "v0004"
    lines = summary_lines("publish", {**RESULTS["publish"], "uri": deep})
    assert lines[0].endswith(deep)
    lines = summary_lines("promote", {**RESULTS["promote"], "reason": "because " * 40})
    assert len(lines[1]) < WIDTH and f"{'because ' * 12}b... (promotion.mode auto)" in lines[1]


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (0.853, "0.85 s"), (12.34, "12.3 s"), (245, "4 min 05 s"),
                                               (7380, "2 h 03 min")])
def test_durations_read_as_people_write_them(seconds, text):
    assert duration(seconds) == text


def test_the_module_imports_only_the_standard_library():
    code = ("import json, sys; before = set(sys.modules); import pipelines.core.summary; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    heavy = {"numpy", "tensorflow", "pyarrow", "pydantic", "yaml", "horovod", "airflow"}
    assert not heavy & {m.split(".")[0] for m in json.loads(out.splitlines()[-1])}
