"""The runs of bench/lr_search.py: the sample data preloaded once, a run directory per training
(a two-rank 70/30 plan on the local pool), the real ``lr_search`` and ``train`` stage commands, and
each trained model scored on the held-out rows.

Held-out scoring loads the exported SavedModel (its ``serve`` endpoint takes raw features and
returns logits, :func:`pipelines.models.evaluate.load_serve`) and runs it over the preload's
held-out shards (:func:`pipelines.models.evaluate.iter_holdout`): accuracy as the analyze stage
counts it, and the mean softmax cross-entropy, the loss the trainer minimises.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process loads the models to score them

import numpy as np  # noqa: E402

from pipelines.data.sample import generate  # noqa: E402
from pipelines.models.evaluate import iter_holdout, load_serve  # noqa: E402
from pipelines.preload.stage import preload as preload_stage  # noqa: E402
from pipelines.spec import DatasetSpec  # noqa: E402
from pipelines.stores.rundir import write_json  # noqa: E402

FAST_SHARE = 0.7  # of the global batch on the fast device (it has 2.5x the slow one's CPU)
# Model variants the combinations name: the project's example models (pipelines/models/examples.py)
# with their own arguments.  tiny_mlp, small_cnn and pair_cnn are the tuning set's; the others are new to the rule.
MODELS: dict[str, tuple[str, dict]] = {
    "tiny_mlp": ("tiny_mlp", {}),  # 784-64-10
    "small_cnn": ("small_cnn", {}),  # conv 16, 32; dense 64
    "wide_mlp": ("tiny_mlp", {"hidden": [256]}),  # 784-256-10
    "deep_mlp": ("tiny_mlp", {"hidden": [128, 64]}),  # 784-128-64-10
    "narrow_cnn": ("small_cnn", {"filters": [8, 16], "dense_units": 32}),
    "conv_net": ("conv_net", {"filters": [16], "dense": [32]}),  # one conv block, a smaller head
    "pair_cnn": ("conv_net", {"filters": [8, 16], "dense": [64]}),  # tuning: a second CNN with SGD at B = 512
}


class Bench:
    """The shared preload and where runs go; ``train`` runs (and scores) one training."""

    def __init__(self, work: Path, rows_per_day: int, days: int, data_seed: int, epochs: int, pool: str):
        self.work, self.epochs, self.pool = work, epochs, pool
        data = work / "data"
        generate(str(data), rows_per_day=rows_per_day, days=days, seed=data_seed)
        self.preload = preload_stage(DatasetSpec(uri=str(data), holdout_fraction=0.1), work / "preload",
                                     seed=data_seed)
        self.feature_shape = [int(d) for d in self.preload.get("feature_shape") or [28, 28, 1]]
        self.num_classes = int(self.preload.get("num_classes") or 10)

    def make_run(self, name: str, combo: tuple[str, int, str], lr, seed: int) -> Path:
        """A run directory with the shared preload result, a two-rank plan and the job spec."""
        model, batch, optimizer = combo
        build, kwargs = MODELS[model]
        run = self.work / name
        shutil.rmtree(run, ignore_errors=True)
        write_json(run / "preload" / "result.json", self.preload)
        fast = round(batch * FAST_SHARE)
        plan = {"global_batch": batch, "ranks": [{"rank": 0, "device": "fast", "batch": fast},
                                                 {"rank": 1, "device": "slow", "batch": batch - fast}]}
        write_json(run / "estimate" / "plan.json", plan)
        write_json(run / "estimate" / "result.json", {"plan": plan, "input_key": "bench"})
        spec = {
            "dataset": {"uri": str(self.work / "data")},
            "model": {"name": build, "kwargs": kwargs},
            # the seed sets the initial weights and every epoch's order of rows (trainer.py)
            "training": {"epochs": self.epochs, "global_batch": batch, "learning_rate": lr,
                         "reference_batch": batch, "optimizer": optimizer, "seed": seed},
            "pool": self.pool,
            "artifact_root": str(self.work),
        }
        write_json(run / "spec.json", spec)
        return run

    def search(self, tag: str, combo: tuple, seed: int) -> tuple[dict, float]:
        """The lr_search stage on a fresh run directory: its result and wall time."""
        run = self.make_run(f"{tag}-search", combo, "auto", seed)
        try:
            return stage("lr_search", run)
        finally:
            shutil.rmtree(run, ignore_errors=True)

    def train(self, name: str, combo: tuple, lr: float, seed: int) -> dict:
        """Train at ``lr`` with ``seed`` and score the model: ``{lr, seed, train_loss, holdout_loss,
        holdout_accuracy, seconds}``; a run whose loss became NaN has infinite losses, no accuracy
        and the seconds until it stopped."""
        run = self.make_run(name, combo, lr, seed)
        started = time.perf_counter()
        try:
            result, seconds = stage("train", run)
            scores = holdout_scores(result["saved_model"], self.preload.get("holdout_shards") or [],
                                    self.feature_shape, self.num_classes)
            return {"lr": lr, "seed": seed, "train_loss": final_loss(run), **scores, "seconds": seconds}
        except SystemExit as e:  # a diverging rate stops training (NaN loss): no model to score
            if "loss is nan" in str(e).lower() or "loss is inf" in str(e).lower():
                return {"lr": lr, "seed": seed, "train_loss": math.inf, "holdout_loss": math.inf,
                        "holdout_accuracy": None, "seconds": time.perf_counter() - started, "diverged": True}
            raise
        finally:
            shutil.rmtree(run, ignore_errors=True)


def stage(name: str, run: Path) -> tuple[dict, float]:
    """Run one stage command; its result and wall time."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines", name, "--spec", str(run / "spec.json"), "--run-dir", str(run), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=3600,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name} in {run} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), seconds


def final_loss(run: Path) -> float:
    """The mean training loss of the last fifth of the run's windows (inf if it diverged)."""
    history = json.loads((run / "train" / "summary.json").read_text())["history"]
    tail = [h["loss"] for h in history[-max(3, len(history) // 5):]]
    return statistics.fmean(tail) if tail and all(math.isfinite(v) for v in tail) else math.inf


def cross_entropy(logits, labels) -> tuple[float, int]:
    """Summed softmax cross-entropy of integer ``labels`` under ``logits`` [n, classes], and the
    number of correct argmax predictions (inf loss when a logit is not finite)."""
    z = np.asarray(logits, dtype=np.float64)
    if not np.isfinite(z).all():
        return math.inf, 0
    z = z - z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    rows = np.arange(len(labels))
    return float(-log_p[rows, labels].sum()), int((z.argmax(axis=1) == labels).sum())


def holdout_scores(saved_model: str, shards: list[str], feature_shape: list[int], num_classes: int) -> dict:
    """The exported model's mean cross-entropy and accuracy over the held-out rows."""
    size = math.prod(feature_shape)
    predict, loss, correct, rows = None, 0.0, 0, 0
    for feats, labels in iter_holdout(shards, size, 1024):
        if predict is None:
            predict = load_serve(saved_model)
        logits = np.asarray(predict(feats.reshape(len(labels), *feature_shape)))
        if logits.shape != (len(labels), num_classes):
            raise SystemExit(f"{saved_model}: logits of shape {logits.shape}, expected [{len(labels)}, {num_classes}]")
        part, hits = cross_entropy(logits, labels)
        loss, correct, rows = loss + part, correct + hits, rows + len(labels)
    if not rows:
        raise SystemExit("the preload wrote no held-out rows: nothing to score the runs on")
    return {"holdout_loss": loss / rows, "holdout_accuracy": correct / rows, "holdout_rows": rows}
