"""The "Summary" section: the run's headline figures in one table."""

from __future__ import annotations

from typing import Any

from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.markup import Raw, esc, num, pct, table
from pipelines.analyze.report.registry import section
from pipelines.analyze.updates import PARAMETER_SERVER


def _ps_summary_rows(train: dict) -> list[tuple[str, Any]]:
    """The summary's parameter-server rows: mode, updates and lost workers."""
    block = train.get("parameter_server") or {}
    workers = block.get("workers") or []
    applied = sum(int(w.get("applied") or 0) for w in workers) if workers else None
    mode = f"{block.get('update_mode', '?')} updates, combiner {block.get('combiner', '?')}"
    return [
        ("Strategy", Raw(f"parameter server ({esc(mode)}, {num(block.get('parameter_servers'))} server(s))")),
        ("Updates applied / dropped", Raw(f"{num(applied)} / {num(block.get('dropped_updates'))}")),
        ("Lost workers", len(block["lost_workers"]) if block.get("lost_workers") is not None else None),
    ]


@section("Summary", place=10)
def summary(r: ReportInputs) -> str:
    train, evaluation, estimate, metrics = r.train, r.evaluation, r.estimate, r.metrics
    ps = r.strategy == PARAMETER_SERVER
    rows = [
        ("Held-out accuracy", Raw(pct((evaluation or {}).get("accuracy")))),
        ("Held-out rows", (evaluation or {}).get("rows")),
        ("Final training loss", train.get("final_loss")),
        ("Epochs / steps", Raw(f"{num(train.get('epochs'))} / {num(train.get('steps'))}")),
        ("Global batch", train.get("global_batch")),
        ("Workers" if ps else "Ranks", len(train.get("ranks") or [])),
        *(_ps_summary_rows(train) if ps else []),
        ("Training throughput (samples/s)", train.get("samples_per_sec")),
        ("Balance efficiency", Raw(pct(metrics.get("balance_efficiency")))),
        ("Learning rate", train.get("learning_rate")),
        ("Training time (s)", train.get("train_seconds")),
        ("Predicted time (s)", ((estimate or {}).get("plan") or {}).get("predicted_total_s")),
        ("Resumed from step", train.get("resumed_from_step")),
    ]
    return table(["Quantity", "Value"], rows)
