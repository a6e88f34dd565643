"""Warm starts: the promoted version's weights as the starting point of a new training
(``training.warm_start``; docs/ARCHITECTURE.md, "Model versions and promotion").

Only when a run starts afresh: a retry resumes from its own checkpoint.  With no promoted version
yet (the first run of a schedule) training starts from a fresh initialisation and says so.  The
promoted version is part of the training's input key (``pipelines.train.result.promoted_version``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipelines.stores.models import WEIGHTS, ModelStore  # WEIGHTS: in train/ and every published version
from pipelines.train.rank_job import TrainingError

log = logging.getLogger("pipelines.train")


def warm_start(model: Any, spec: Any, scratch: Path) -> str | None:
    """Load the promoted version's weights into ``model``; returns the version, or None when there
    is none to start from.  A version of another architecture is a :class:`TrainingError` naming
    it and the model."""
    store, name = ModelStore(spec.model_store_uri()), spec.model_store_name()
    promoted = store.promoted(name)
    if promoted is None:
        log.info("training.warm_start: no promoted version of %s in %s yet; starting from scratch", name, store.uri)
        return None
    version = promoted["version"]
    path = store.download(name, version, WEIGHTS, scratch)
    try:
        model.load_weights(str(path))
    except (ValueError, KeyError, OSError) as e:
        raise TrainingError(
            f"training.warm_start: the promoted version {version} of {name} ({promoted.get('uri')}) does not fit "
            f"model {spec.model.name} with kwargs {spec.model.kwargs}: {e}"
        ) from None
    log.info("training.warm_start: starting from %s %s (%s)", name, version, promoted.get("uri"))
    return version
