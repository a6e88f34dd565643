"""The train stage's result: one contract whichever launcher started the ranks.

Rank 0 of the trainer builds the result from its summary (:func:`stage_result`), writes it as
``train/result.json`` (atomically, last) and prints it as the last line of its standard output.
The local train stage returns that file's result, adding only what the launcher knows
(``quota_enforced``, ``launcher_seconds``); the Kubernetes gang operator returns rank 0's last
JSON line.  The key of the inputs (:func:`train_input_key`) is computed by this one function on
both paths, so a finished result with the same key is returned without training again, by the
local stage before it starts ranks and by every rank before it joins the rendezvous
(docs/ARCHITECTURE.md, "Stages and their contracts").

No heavy imports: the Airflow side's tests build results with it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.stores.rundir import RunDir, input_key, read_completed

STAGE = "train"
RESULT_FILE = "result.json"
LEFT_OUT = ("history", "checkpoint_saves")  # stay in summary.json, out of XCom


def train_input_key(
    spec: Any, run_dir: RunDir, plan: dict[str, Any] | None, overrides: dict[str, Any] | None = None
) -> str:
    """The key of what the ranks train on: the job spec, the plan, lr_search's rate (if it ran),
    preload's key, the promoted version a warm start begins from, and the trainer options that
    change the result (only when set)."""
    lr_path = run_dir.result_path("lr_search")
    learning_rate = json.loads(lr_path.read_text()).get("learning_rate") if lr_path.is_file() else None
    from pipelines.train.warm import promoted_version

    parts: list[Any] = [json.loads(spec.to_json()), plan, learning_rate, run_dir.read_result("preload").get("input_key")]
    if spec.training.warm_start:  # a newly promoted version is a new starting point
        parts.append({"warm_start": promoted_version(spec)})
    if overrides:
        parts.append(overrides)
    return input_key(*parts)


def stage_result(summary: dict[str, Any], key: str, run_dir: RunDir) -> dict[str, Any]:
    """The stage result of a finished run: the summary less its long lists, with the input key."""
    result = {k: v for k, v in summary.items() if k not in LEFT_OUT}
    result.update(input_key=key, stage=STAGE, run_dir=str(run_dir))
    return result


def result_path(out: str | Path) -> Path:
    """Where the result lies in the train output folder (``<run dir>/train`` unless ``--out``)."""
    return Path(out) / RESULT_FILE


def completed(out: str | Path, key: str) -> dict[str, Any] | None:
    """The stored result in ``out`` when it was made from the same inputs, else None."""
    return read_completed(result_path(out), key)
