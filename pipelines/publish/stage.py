"""The ``publish`` stage: the trained model as a new immutable version in the model store
(docs/ARCHITECTURE.md, "Model versions and promotion").

Copies the SavedModel, the final checkpoint and the weights of ``train/`` to
``<model_store>/<model name>/<version>/`` with metadata (run, data interval, spec, input key,
training figures, devices), written last so a half-copied version is never visible.  A retry of
the same run returns the version it made instead of making a second one.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.errors import StageError
from pipelines.spec import JobSpec
from pipelines.stores.models import WEIGHTS, ModelStore
from pipelines.stores.rundir import RunDir, input_key
from pipelines.tracking.stages import Tracking

log = logging.getLogger(__name__)


TRAIN_FIGURES = ("final_loss", "final_train_accuracy", "train_seconds", "samples_per_sec", "steps", "epochs",
                 "global_batch", "learning_rate", "warm_started_from")


def final_checkpoint(folder: Path) -> dict[str, Path]:
    """The newest checkpoint's files in a checkpoint folder (its ``checkpoint`` index names it),
    as ``{"checkpoint/<file>": path}``."""
    index = folder / "checkpoint"
    found = re.search(r'^model_checkpoint_path: "([^"]+)"', index.read_text(), re.M) if index.is_file() else None
    if found is None:
        raise StageError(f"{folder}: no checkpoint index; did the train stage finish?")
    prefix = found[1]
    files = {f"checkpoint/{p.name}": p for p in sorted(folder.glob(f"{prefix}.*"))}
    if not any(name.endswith(".index") for name in files):
        raise StageError(f"{folder}: checkpoint {prefix} is named in the index but its files are missing")
    return {"checkpoint/checkpoint": index, **files}


def version_metadata(spec: JobSpec, ctx: StageContext, train: dict[str, Any]) -> dict[str, Any]:
    """What a version records about the run that made it."""
    return {
        "dag_id": ctx.dag_id,
        "run_id": ctx.run_id,
        "data_interval": {"start": ctx.data_interval_start, "end": ctx.data_interval_end},
        "spec": json.loads(spec.to_json()),
        "train_input_key": train.get("input_key"),
        "training": {k: train.get(k) for k in TRAIN_FIGURES},
        "devices": [{"device": r.get("device"), "batch": r.get("batch")} for r in train.get("ranks") or []],
    }


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """Publish the run's model; returns ``{model, version, uri, store, published_at, input_key}``, and
    ``mlflow`` (its run, the registered version) with ``tracking.mlflow_uri``."""
    tracking = Tracking.start(spec, ctx)  # an unusable MLflow stops the stage here, before the copy
    train = run_dir.read_result("train")
    out = run_dir.root / "train"
    files: dict[str, Any] = {"saved_model": Path(train.get("saved_model") or out / "saved_model"), WEIGHTS: out / WEIGHTS}
    files.update(final_checkpoint(Path(train.get("checkpoint_dir") or out / "checkpoints")))
    store, name = ModelStore(spec.model_store_uri()), spec.model_store_name()
    # One version per run and training: a retry (or a rerun with the same inputs) finds its own.
    key = input_key("publish/1", ctx.dag_id, ctx.run_id, train.get("input_key"))
    meta = store.publish(name, files, version_metadata(spec, ctx, train), run_key=key)
    log.info("published %s %s at %s", name, meta["version"], meta["uri"])
    result = {"model": name, "version": meta["version"], "uri": meta["uri"], "store": store.uri,
              "published_at": meta["published_at"], "input_key": key}
    return {**result, **tracking.published(result, files["saved_model"])}
