"""The train stage's outcome: one contract whichever strategy trained and whichever launcher
started it.

A training run of either strategy (the Horovod trainer's rank 0, the parameter-server chief)
ends with a :class:`RunSummary`, written as ``train/summary.json``; the stage result is that
summary less its long lists, with the input key (:func:`stage_result`), written as
``train/result.json`` (atomically, last) and printed as the program's last line of standard
output (:meth:`RunSummary.write`).  The local train stage returns that file's result, adding only
what the launcher knows (``quota_enforced``, ``launcher_seconds``); the Kubernetes operators
return the last JSON line.  The key of the inputs (:func:`train_input_key`) is computed by this
one function on both paths, so a finished result with the same key is returned without training
again, by the local stage before it starts ranks and by every rank or task before it joins its
job (docs/ARCHITECTURE.md, "Stages and their contracts").

No heavy imports: the Airflow side's tests build results with it too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pipelines.stores.models import ModelStore
from pipelines.stores.rundir import RunDir, input_key, read_completed, write_json

STAGE = "train"
RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.json"
LEFT_OUT = ("history", "checkpoint_saves", "loss_curve")  # stay in summary.json, out of XCom
PARAMETER_SERVER = "parameter_server"  # a summary's ``strategy``; a Horovod summary has none
# Keys only a parameter-server summary has: a Horovod run's summary reads as those written
# before there were two strategies.
PARAMETER_SERVER_ONLY = ("strategy", "updates", "parameter_server")


@dataclasses.dataclass
class RunFigures:
    """The whole run's speed and balance: per rank (a Horovod rank, or a parameter-server worker)
    and for the run."""

    ranks: list[dict] = dataclasses.field(default_factory=list)  # per rank: device, batch, speed, times
    loop_seconds: float = 0.0  # the whole training loop
    samples_per_sec: float = 0.0  # over the whole loop
    input_wait_fraction: float = 0.0  # of the steady loop
    steady_seconds: float = 0.0  # the loop less its first window, which also traced the graph
    balance_efficiency: float = 0.0  # the share of the loop the ranks spent computing


@dataclasses.dataclass
class RunSummary:
    """A training run's ``summary.json``: the same keys for both strategies (a parameter-server
    run's ``ranks`` are its workers), and for a parameter-server run its ``strategy``, its
    ``updates`` and its ``parameter_server`` section."""

    global_batch: int
    epochs: int
    steps: int  # optimizer steps: Horovod steps, applied updates (async, bounded) or rounds (sync)
    figures: RunFigures  # its fields are keys of the summary
    rebalance_events: list[dict]
    final_loss: float
    final_train_accuracy: float
    train_seconds: float
    timings: dict[str, float]  # where the time went before the loop: startup_s, calibration_s
    learning_rate: float  # the base rate, at the global batch
    saved_model: str
    events_dir: str
    checkpoint_dir: str
    checkpoint_saves: list[dict]  # this process's last saves: step, seconds
    checkpoint_seconds: float
    resumed_from_step: int
    warm_started_from: str | None  # the promoted version training started from
    history: list[dict]  # the last window records
    strategy: str | None = None  # PARAMETER_SERVER, or None (Horovod)
    updates: int | None = None  # updates the workers computed, applied or not
    parameter_server: dict[str, Any] | None = None  # per worker updates, staleness, lost workers
    loss_curve: list[list[float]] | None = None  # [step, window loss] of every window, thinned (loss_curve())

    def to_json(self) -> dict[str, Any]:
        """The summary as ``summary.json`` holds it."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "figures"}
        out.update(dataclasses.asdict(self.figures))
        for name in PARAMETER_SERVER_ONLY:
            if out[name] is None:
                del out[name]
        return out

    def result(self, key: str, run_dir: RunDir) -> dict[str, Any]:
        """The stage result of this run, made from inputs of ``key``."""
        return stage_result(self.to_json(), key, run_dir)

    def write(self, out: Path, key: str, run_dir: RunDir) -> dict[str, Any]:
        """``summary.json`` and, last (its presence means the stage is done), ``result.json`` in
        the train output folder ``out``; returns the result."""
        result = self.result(key, run_dir)
        write_json(out / SUMMARY_FILE, self.to_json())
        write_json(result_path(out), result)
        return result


def promoted_version(spec: Any) -> str | None:
    """The promoted version's name when ``training.warm_start`` is on and there is one, else None
    (part of the input key: a newly promoted model is a new starting point)."""
    if not spec.training.warm_start:
        return None
    promoted = ModelStore(spec.model_store_uri()).promoted(spec.model_store_name())
    return promoted["version"] if promoted else None


def train_input_key(
    spec: Any, run_dir: RunDir, plan: dict[str, Any] | None, overrides: dict[str, Any] | None = None
) -> str:
    """The key of what the ranks train on: the job spec, the plan, lr_search's rate (if it ran),
    preload's key, the promoted version a warm start begins from, and the trainer options that
    change the result (only when set)."""
    lr_path = run_dir.result_path("lr_search")
    learning_rate = json.loads(lr_path.read_text()).get("learning_rate") if lr_path.is_file() else None
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


def loss_curve(history: list[dict], most: int = 400) -> list[list[float]]:
    """``[[step, loss], ...]`` of every window record, from the first: every k-th window and the
    last, at most about ``most`` points (the summary keeps only the last windows' records, and
    the estimator's time to accuracy needs the whole curve: pipelines.stores.convergence)."""
    points = [[int(h["step"]), round(float(h["loss"]), 6)] for h in history if h.get("loss") is not None]
    if len(points) > most:
        kept = points[:: -(-len(points) // most)]
        points = kept if kept[-1] is points[-1] else [*kept, points[-1]]
    return points
