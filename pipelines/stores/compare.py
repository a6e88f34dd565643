"""A published model version against the promoted one, both evaluated on the same held-out rows
(docs/ARCHITECTURE.md, "Model versions and promotion"): what analyze reports and decides with, and
what promote decides with again when another run promoted in between.  TensorFlow is imported only
when a promoted version has to be evaluated (:func:`pipelines.models.evaluate.evaluate`).
"""

from __future__ import annotations

from pathlib import Path

from pipelines.models.evaluate import evaluate
from pipelines.spec import JobSpec
from pipelines.stores.models import ModelStore

__all__ = ["compare_versions"]


def compare_versions(
    spec: JobSpec, preload: dict, evaluation: dict, publish: dict | None, promoted: dict | None, scratch: Path
) -> dict | None:
    """The published version against the promoted one (``promoted``: its metadata, None before
    any promotion), both evaluated on this run's held-out rows (docs/ARCHITECTURE.md, "Model
    versions and promotion"); None when nothing was published.

    ``promotable`` is whether the new version may replace the promoted one: its held-out accuracy
    is at most ``promotion.tolerance`` below the promoted one's (always, when none is promoted)."""
    if publish is None:
        return None
    store, name, tolerance = ModelStore(spec.model_store_uri()), spec.model_store_name(), spec.promotion.tolerance
    new = {"version": publish["version"], "uri": publish["uri"], "accuracy": evaluation["accuracy"],
           "per_class_accuracy": evaluation["per_class_accuracy"]}
    if promoted is None or promoted["version"] == publish["version"]:
        why = "no version is promoted yet" if promoted is None else f"{publish['version']} is already the promoted version"
        return {"new": new, "promoted": None, "tolerance": tolerance, "promotable": True, "reason": why}
    saved = store.download(name, promoted["version"], "saved_model", scratch)
    old = evaluate(saved, preload.get("holdout_shards") or [], preload.get("feature_shape") or spec.dataset.feature_shape,
                   int(preload.get("num_classes") or spec.dataset.num_classes))
    old_entry = {"version": promoted["version"], "uri": promoted.get("uri"), "accuracy": old["accuracy"],
                 "per_class_accuracy": old["per_class_accuracy"], "run_id": promoted.get("run_id"),
                 "data_interval": promoted.get("data_interval")}
    a, b = new["accuracy"], old["accuracy"]
    promotable = a is not None and (b is None or a >= b - tolerance)
    reason = (f"held-out accuracy {a if a is None else round(a, 4)} against {b if b is None else round(b, 4)} of the promoted "
              f"{promoted['version']} on the same {old.get('rows')} rows: "
              f"{'within' if promotable else 'more than'} the tolerance {tolerance:g} {'of' if promotable else 'below'} it")
    return {"new": new, "promoted": old_entry, "tolerance": tolerance, "promotable": promotable, "reason": reason}
