"""The profiling sweep's model family: generated models whose structure varies along the features
the estimator learns from (docs/ARCHITECTURE.md, "The learned estimator").

Five kinds, each a fixed grid of the example builders' arguments (pipelines.models.examples):

* CNNs (``conv_net``): input size and channels, conv layers, filters, dense layers and units;
* MLPs (``tiny_mlp``): input size, hidden layers and units;
* residual CNNs (``residual_cnn``): input, stages and their filters, blocks per stage, with or
  without batch normalisation, a dense layer or none after the global pooling;
* depthwise-separable CNNs (``separable_cnn``, MobileNet-like): input, the blocks' filters, with or
  without batch normalisation;
* embedding models (``embedding_net``): input, quantisation levels, embedding width, dense layers.

Each kind's grid is shuffled with a fixed seed, and a size takes the first members of each kind
in a fixed order of kinds (:data:`WEIGHTS`, apportioned one model at a time), so a size always
means the same models and a larger size contains the smaller ones.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from pipelines.errors import StageError

NUM_CLASSES = 10
# size -> (models, batches timed per model, timed seconds per batch).  A window spans several CFS
# periods (100 ms): a quota-limited device runs 1 or 2 fewer throttled periods in a window of 2
# depending on where it starts, which spread ``tiny``'s steps by up to a third, and with a 4x batch
# gap its larger batch once measured faster than its smaller (0.0169 s against 0.0175 s, beside
# other suites).  ``tiny`` times 4 periods at an 8x gap.
SIZES: dict[str, tuple[int, tuple[int, ...], float]] = {
    "tiny": (3, (8, 64), 0.4),
    "small": (17, (16, 64, 160), 0.5),
    "medium": (32, (16, 48, 128, 256), 0.5),
    "large": (64, (8, 32, 64, 128, 256), 0.6),
}
INPUTS = ((16, 1), (28, 1), (32, 3))  # (side, channels) of the generated models' inputs


def _member(kind: str, model: str, side: int, channels: int, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"{kind}-{side}x{side}x{channels}-{name}", "model": model, "input_shape": [side, side, channels],
            "kwargs": kwargs}


def _cnns() -> list[dict[str, Any]]:
    out = []
    grid = itertools.product((16, 28, 32, 40), (1, 3), (1, 2, 3), (8, 16, 32), (1, 2), (32, 64, 128))
    for side, channels, convs, base, denses, units in grid:
        filters = [base * 2**i for i in range(convs)]
        out.append(_member("cnn", "conv_net", side, channels, f"c{'-'.join(map(str, filters))}-d{denses}x{units}",
                           {"filters": filters, "dense": [units] * denses}))
    return out


def _mlps() -> list[dict[str, Any]]:
    out = []
    for (side, channels), layers, units in itertools.product(INPUTS, (1, 2, 3), (64, 128, 256, 512)):
        out.append(_member("mlp", "tiny_mlp", side, channels, f"h{layers}x{units}", {"hidden": [units] * layers}))
    return out


def _residuals() -> list[dict[str, Any]]:
    out = []
    for (side, channels), stages, base, blocks, bn, units in itertools.product(
            INPUTS, (1, 2, 3), (8, 16), (1, 2), (True, False), (0, 64)):
        filters = [base * 2**i for i in range(stages)]
        dense = [units] if units else []
        out.append(_member("res", "residual_cnn", side, channels,
                           f"s{'-'.join(map(str, filters))}x{blocks}{'-bn' if bn else ''}-d{units}",
                           {"filters": filters, "blocks": blocks, "batch_norm": bn, "dense": dense}))
    return out


def _separables() -> list[dict[str, Any]]:
    out = []
    shapes = ((1, 2), (1, 2, 2), (1, 2, 4), (1, 2, 2, 4, 4))
    for (side, channels), shape, base, bn in itertools.product(INPUTS, shapes, (8, 16, 32), (True, False)):
        filters = [base * m for m in shape]
        out.append(_member("sep", "separable_cnn", side, channels, f"f{'-'.join(map(str, filters))}{'-bn' if bn else ''}",
                           {"filters": filters, "batch_norm": bn}))
    return out


def _embeddings() -> list[dict[str, Any]]:
    out = []
    for (side, channels), levels, dim, dense in itertools.product(INPUTS, (4, 16), (8, 16, 32), ((), (64,), (128,))):
        out.append(_member("emb", "embedding_net", side, channels, f"l{levels}-e{dim}-d{'-'.join(map(str, dense)) or 0}",
                           {"levels": levels, "dim": dim, "dense": list(dense)}))
    return out


# kind -> (its grid, its share of a sweep); the order of kinds breaks ties
WEIGHTS: dict[str, tuple[Any, float]] = {
    "cnn": (_cnns, 3.0),
    "mlp": (_mlps, 1.5),
    "res": (_residuals, 2.0),
    "sep": (_separables, 1.5),
    "emb": (_embeddings, 1.0),
}
# kind -> the seed its grid is shuffled with.  The CNNs' and MLPs' keep the order of the family
# before the other kinds; the residual CNNs' puts a small one with batch normalisation first, so
# that ``tiny`` stays quick; the embeddings' gives the first two different inputs and widths.
SEEDS = {"cnn": 0, "mlp": 1, "res": 33, "sep": 3, "emb": 8}


# Every kind gets this many members before any kind gets more than that: the laws of a kind's
# features are learnt from its models, and cross-validation holds one out, so with 2 a held-out
# model's kind was fitted from a single other model (bench/README.md, bench/estimator.py: held-out
# errors of 30-50% on embedding models and MLPs from a sweep with 2 of each, under 11% on the
# kinds with 3 or more; in one bank the 3 models this adds to ``small`` took the other 14's
# held-out error from 19-20% to 14%).
MIN_PER_KIND = 3


def kinds(n: int) -> list[str]:
    """The kinds of the first ``n`` members: each next member goes to the kind with the largest
    ``weight / (members so far + 0.5)`` (Sainte-Laguë), so every prefix is apportioned by weight,
    among the kinds with fewer than :data:`MIN_PER_KIND` members while there are any."""
    taken = dict.fromkeys(WEIGHTS, 0)
    out = []
    for _ in range(n):
        short = [k for k in WEIGHTS if taken[k] < MIN_PER_KIND]
        kind = max(short or WEIGHTS, key=lambda k: WEIGHTS[k][1] / (taken[k] + 0.5))
        taken[kind] += 1
        out.append(kind)
    return out


def family(size: str) -> list[dict[str, Any]]:
    """The models of a sweep of ``size`` (see SIZES), every kind by its weight."""
    if size not in SIZES:
        raise StageError(f"sweep size {size!r} is not one of {sorted(SIZES, key=lambda s: SIZES[s][0])}")
    grids = {}
    for kind, (grid, _) in WEIGHTS.items():
        grids[kind] = grid()
        random.Random(SEEDS[kind]).shuffle(grids[kind])
    taken = dict.fromkeys(WEIGHTS, 0)
    out = []
    for kind in kinds(SIZES[size][0]):
        out.append(grids[kind][taken[kind]])
        taken[kind] += 1
    return out


def batches(size: str) -> tuple[int, ...]:
    return SIZES[size][1]


def seconds(size: str) -> float:
    return SIZES[size][2]
