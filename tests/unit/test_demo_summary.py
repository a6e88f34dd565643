"""`make demo`'s terminal output (scripts/demo_summary.py): at most 15 lines of summary from a run
directory, and the progress filter that keeps the stages' multi-kilobyte JSON results off the
terminal."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("demo_summary", ROOT / "scripts" / "demo_summary.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


def write(run: Path, stage: str, doc: dict) -> None:
    (run / stage).mkdir(parents=True, exist_ok=True)
    (run / stage / "result.json").write_text(json.dumps(doc))


@pytest.fixture
def run(tmp_path) -> Path:
    run = tmp_path / "artifacts" / "train_pipeline" / "manual__2026-01-01T00_00_00+00_00"
    ranks = [{"device": "fast", "batch": 366, "samples_per_sec": 580.2}, {"device": "slow", "batch": 146, "samples_per_sec": 232.1}]
    write(run, "lr_search", {"learning_rate": 0.0421, "method": "confirmed", "curve": {"lr": list(range(500))}})
    write(run, "train", {"train_seconds": 75.2, "samples_per_sec": 812.4, "ranks": ranks, "history_len": 1})
    write(run, "publish", {"model": "small_cnn", "version": "v0004", "uri": "/art/models/small_cnn/v0004"})
    write(run, "promote", {"promoted": True, "previous": "v0003", "reason": "held-out accuracy within the tolerance"})
    write(run, "analyze", {
        "report": f"{run}/analyze/report.html", "holdout_accuracy": 0.91234, "balance_efficiency": 0.93,
        "predicted_total_s": 41.5, "actual_train_s": 75.2, "prediction_error": -0.448, "samples_per_sec": 812.4,
        "comparison": {"promoted": {"version": "v0003", "accuracy": 0.9}, "promotable": True},
        "per_class_accuracy": [0.9] * 10,
    })
    return run


def test_the_summary_is_at_most_15_short_lines_with_what_a_person_wants(run, capsys):
    code = demo.main(["--artifacts", str(run.parents[1]), "--log", "/repo/.airflow/demo.log"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and len(out) <= demo.MAX_LINES == 15
    assert not any("{" in line for line in out)  # no JSON for people
    text = "\n".join(out)
    for words in (f"run: {run}", "held-out accuracy: 0.9123 (promoted v0003: 0.9000)",
                  "training time: predicted 41.5 s, actual 75.2 s (error -44.8%)",
                  "throughput: 812 samples/s, balance efficiency 0.93", "ranks: fast batch 366 580/s, slow batch 146 232/s",
                  "learning rate: 0.0421 (confirmed)", "published: small_cnn v0004 at /art/models/small_cnn/v0004",
                  "promoted v0004 (held-out accuracy within the tolerance; the promoted version was v0003)",
                  f"report: {run}/analyze/report.html", f"full results (JSON): {run}/<stage>/result.json",
                  "full log: /repo/.airflow/demo.log"):
        assert words in text, f"{words!r} not in:\n{text}"


def test_a_run_that_did_not_reach_promote_fails_after_its_summary(run, capsys):
    (run / "promote" / "result.json").unlink()
    assert demo.main(["--artifacts", str(run.parents[1])]) == 1
    out, err = capsys.readouterr()
    assert "held-out accuracy: 0.9123" in out and "did not reach the promote task" in err


def test_no_finished_run_is_an_error(tmp_path, capsys):
    assert demo.main(["--artifacts", str(tmp_path), "--log", "/x/demo.log"]) == 1
    assert "did not produce an analysis; see the log /x/demo.log" in capsys.readouterr().err


RESULT_LINE = json.dumps({"final_loss": 0.3, "history": [{"loss": 0.3, "step": i} for i in range(200)]})


@pytest.mark.parametrize(("line", "shown"), [
    ("[2026-01-01T10:00:00.000+0000] {taskinstance.py:1} INFO - Marking task as SUCCESS. dag_id=train_pipeline, "
     "task_id=preload, run_id=manual__2026, logical_date=2026, start_date=2026, end_date=2026", "task preload: success"),
    ("2026-01-01 10:00:00 [info] Marking task as FAILED. dag_id=train_pipeline, task_id=train, run_id=x", "task train: failed"),
    (f"[2026-01-01T10:00:01] {{local_runner.py:101}} INFO - [rank 0] {RESULT_LINE}", None),
    (f"[2026-01-01T10:00:01] {{local_runner.py:101}} INFO - {json.dumps({'calibrated': ['slow'], 'plan': {}})}", None),
    ("[2026-01-01T10:00:02] {local_runner.py:101} INFO - [rank 0] 2026-01-01 10:00:02,000 INFO pipelines.train: "
     "epoch 1 done: loss 0.41", "[rank 0] 2026-01-01 10:00:02,000 INFO pipelines.train: epoch 1 done: loss 0.41"),
    ("[2026-01-01T10:00:03] {local_runner.py:101} INFO - 2026-01-01 10:00:03,000 INFO pipelines.estimate.stage: "
     "calibrated slow: 0.02 s + 0.001 s/sample", "calibrated slow: 0.02 s + 0.001 s/sample"),
    ("[2026-01-01T10:00:04] {local_runner.py:101} INFO - some other line", None),
    ("ERROR: dataset.uri: /nope does not exist", "ERROR: dataset.uri: /nope does not exist"),
])
def test_progress_keeps_short_human_lines(line, shown):
    assert demo.progress_line(line) == shown


def test_progress_cuts_long_lines_and_streams(capsys):
    long = "ERROR: " + "x" * 1000
    out = io.StringIO()
    demo.progress(io.StringIO(f"{long}\nnothing here\n[rank 0] {RESULT_LINE}\n"), out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and len(lines[0]) == demo.WIDTH and lines[0].endswith("...")
