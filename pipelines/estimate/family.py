"""The profiling sweep's model family: generated CNNs and MLPs whose structure varies along the
features the estimator learns from (docs/ARCHITECTURE.md, "The learned estimator").

CNNs (``conv_net``) vary the input size and channels, the number of conv layers, their filters,
the number of dense layers and their units; MLPs (``tiny_mlp``) vary the input size, the number of
hidden layers and their units.  The family is a fixed grid shuffled with a fixed seed, so a size
always means the same models, and a larger size contains the smaller ones.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from pipelines.errors import StageError

NUM_CLASSES = 10
# size -> (models, batches timed per model, timed seconds per batch)
SIZES: dict[str, tuple[int, tuple[int, ...], float]] = {
    "tiny": (3, (8, 32), 0.2),
    "small": (14, (16, 64, 160), 0.5),
    "medium": (32, (16, 48, 128, 256), 0.5),
    "large": (64, (8, 32, 64, 128, 256), 0.6),
}


def _cnns() -> list[dict[str, Any]]:
    out = []
    grid = itertools.product((16, 28, 32, 40), (1, 3), (1, 2, 3), (8, 16, 32), (1, 2), (32, 64, 128))
    for side, channels, convs, base, denses, units in grid:
        filters = [base * 2**i for i in range(convs)]
        out.append({
            "id": f"cnn-{side}x{side}x{channels}-c{'-'.join(map(str, filters))}-d{denses}x{units}",
            "model": "conv_net",
            "input_shape": [side, side, channels],
            "kwargs": {"filters": filters, "dense": [units] * denses},
        })
    return out


def _mlps() -> list[dict[str, Any]]:
    out = []
    for (side, channels), layers, units in itertools.product(((16, 1), (28, 1), (32, 3)), (1, 2, 3), (64, 128, 256, 512)):
        out.append({
            "id": f"mlp-{side}x{side}x{channels}-h{layers}x{units}",
            "model": "tiny_mlp",
            "input_shape": [side, side, channels],
            "kwargs": {"hidden": [units] * layers},
        })
    return out


def family(size: str) -> list[dict[str, Any]]:
    """The models of a sweep of ``size`` (see SIZES): about three CNNs for every MLP."""
    if size not in SIZES:
        raise StageError(f"sweep size {size!r} is not one of {sorted(SIZES, key=lambda s: SIZES[s][0])}")
    n = SIZES[size][0]
    cnns, mlps = _cnns(), _mlps()
    random.Random(0).shuffle(cnns)
    random.Random(1).shuffle(mlps)
    n_mlp = max(1, n // 4)
    return cnns[: n - n_mlp] + mlps[:n_mlp]


def batches(size: str) -> tuple[int, ...]:
    return SIZES[size][1]


def seconds(size: str) -> float:
    return SIZES[size][2]
