"""Regressions over the profile bank, one set per device type, chosen by cross-validation
(docs/ARCHITECTURE.md, "The learned estimator").

Every law is linear in its coefficients and affine in the batch ``b``::

    y(model, b) = c0 + Σ_k c_k · const_k(model) + b · Σ_j d_j · per_sample_j(model)

with every coefficient ≥ 0 (non-negative least squares, so no law predicts a negative time or
memory, and extrapolation to larger models stays monotone).  Being affine in ``b`` it gives the
planner its ``fixed_s + per_sample_s · b`` profile exactly.  Rows are weighted by ``1/y`` so the
fit minimises the *relative* error, the figure a prediction is judged by.

The law of each quantity is chosen among a few candidates by grouped k-fold cross-validation:
all rows of one model are held out together, so the score is the error on models the fit never
saw.  The candidate with the lowest mean absolute percentage error wins; its score and every
candidate's are reported.

The laws that use the optional columns need them, and rows written before them lack them.  There
are three tiers (:data:`pipelines.stores.profile_bank.OPTIONAL_TIERS`): the layer mix (the bytes out
of normalisation layers, of layers with a fused activation and of embedding lookups), then the
conv FLOPs at a vector width, then the convs' backprop workspace (:mod:`pipelines.estimate.features`).
For the richest tier first: a device type whose rows all have its columns and those of the tiers
before gets every candidate that uses them; one with rows of at least :data:`MIN_TIER_MODELS`
models that have them, and at least half of its models, fits on those alone (its older rows still
correct their own model's prediction, :mod:`pipelines.estimate.predict`); otherwise the next tier
down is tried, and at the bottom the older candidates fit every row until the device type is
profiled again.  The half keeps a bank swept before a tier existed on its sweep: the few models
that the runs since have recorded with the tier's columns are not enough to replace it (a new
sweep is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipelines.stores.profile_bank import (
    OPTIONAL,
    OPTIONAL_TIERS,
    BankError,
    ProfileBank,
    complete_steps,
    has_columns,
)

# name -> (per-model features, per-sample features); an intercept is always included.
STEP_LAWS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "flops": ((), ("train_flops_per_sample",)),
    "flops+params": (("params",), ("train_flops_per_sample",)),
    "flops+activations+params+layers": (("params", "num_layers"), ("train_flops_per_sample", "activation_bytes_per_sample")),
    "conv+dense+activations+params+layers": (
        ("params", "num_layers"),
        ("conv_flops_per_sample", "dense_flops_per_sample", "activation_bytes_per_sample"),
    ),
    # the layer mix (pipelines.estimate.features): normalisation, fused activations and embedding
    # lookups move memory more than their FLOPs say
    "conv+dense+activations+norm+embedding+params+layers": (
        ("params", "num_layers"),
        ("conv_flops_per_sample", "dense_flops_per_sample", "activation_bytes_per_sample", "norm_bytes_per_sample",
         "embedding_bytes_per_sample"),
    ),
    "conv+dense+activations+mix+params+layers": (
        ("params", "num_layers"),
        ("conv_flops_per_sample", "dense_flops_per_sample", "activation_bytes_per_sample", "activated_bytes_per_sample",
         "norm_bytes_per_sample", "embedding_bytes_per_sample"),
    ),
    # the convs' FLOPs at a vector width besides the plain ones: NNLS weighs the two, so a layer of
    # few channels costs what its blocks do where the device computes in blocks
    **{f"conv+simd{w}+dense+activations+mix+params+layers": (
        ("params", "num_layers"),
        ("conv_flops_per_sample", f"conv_flops_simd{w}_per_sample", "dense_flops_per_sample",
         "activation_bytes_per_sample", "activated_bytes_per_sample", "norm_bytes_per_sample",
         "embedding_bytes_per_sample"),
    ) for w in (8, 16)},
}
MEMORY_LAWS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "params+activations": (("params",), ("activation_bytes_per_sample",)),
    "params+activations+input": (("params",), ("activation_bytes_per_sample", "input_size")),
    # a layer with a fused activation keeps its pre-activation too; an embedding's sparse gradient
    # is as large as its lookups
    "params+activations+input+activated": (("params",), ("activation_bytes_per_sample", "input_size",
                                                         "activated_bytes_per_sample")),
    "params+activations+input+activated+embedding": (("params",), ("activation_bytes_per_sample", "input_size",
                                                                   "activated_bytes_per_sample",
                                                                   "embedding_bytes_per_sample")),
    # the scratch buffer a conv's gradient takes on the CPU, up to 30 MiB at any batch
    "params+workspace+activations+input+activated+embedding": (("params", "conv_workspace_bytes"),
                                                               ("activation_bytes_per_sample", "input_size",
                                                                "activated_bytes_per_sample",
                                                                "embedding_bytes_per_sample")),
}
TRACE_LAWS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "layers": (("num_layers",), ()),
    "layers+params": (("num_layers", "params"), ()),
}
FOLDS = 5
MIN_TIER_MODELS = 5  # models with a tier's optional columns that a device type's laws need to leave its older rows out


@dataclass
class Law:
    """A fitted law: ``predict(features, batch)`` and its affine parts."""

    name: str
    const: tuple[str, ...]
    per_sample: tuple[str, ...]
    coef: list[float]  # intercept, then const, then per_sample coefficients
    cv_mape: float | None = None  # of the chosen law, on held-out models
    candidates: dict[str, float | None] = field(default_factory=dict)
    rows: int = 0
    models: int = 0

    def affine(self, features: dict[str, Any]) -> tuple[float, float]:
        """``(fixed, per_sample)``: the law at batch ``b`` is ``fixed + per_sample · b``."""
        n = len(self.const)
        fixed = self.coef[0] + sum(c * float(features[k]) for c, k in zip(self.coef[1:1 + n], self.const, strict=True))
        per = sum(c * float(features[k]) for c, k in zip(self.coef[1 + n:], self.per_sample, strict=True))
        return fixed, per

    def predict(self, features: dict[str, Any], batch: float) -> float:
        fixed, per = self.affine(features)
        return fixed + per * batch

    def to_dict(self) -> dict[str, Any]:
        return {"law": self.name, "coefficients": dict(zip(["intercept", *self.const, *(f"batch*{k}" for k in self.per_sample)],
                                                          self.coef, strict=True)),
                "cv_mape": self.cv_mape, "candidates": self.candidates, "rows": self.rows, "models": self.models}


def _design(rows: list[dict[str, Any]], const: tuple[str, ...], per_sample: tuple[str, ...]):
    import numpy as np

    cols = [np.ones(len(rows))]
    cols += [np.array([float(r[k]) for r in rows]) for k in const]
    cols += [np.array([float(r[k]) * float(r["batch"]) for r in rows]) for k in per_sample]
    return np.column_stack(cols)


def fit_law(rows: list[dict[str, Any]], target: str, name: str, const: tuple[str, ...],
            per_sample: tuple[str, ...]) -> Law:
    """Non-negative least squares of ``target`` on the law's design, relative error weighting."""
    import numpy as np
    from scipy.optimize import nnls

    x = _design(rows, const, per_sample)
    y = np.array([float(r[target]) for r in rows])
    w = 1.0 / y
    scale = np.maximum(np.abs(x).max(axis=0), 1e-30)  # columns to a common range: NNLS is then well conditioned
    coef, _ = nnls((x / scale) * w[:, None], y * w, maxiter=50 * x.shape[1])
    return Law(name, const, per_sample, (coef / scale).tolist(), rows=len(rows),
               models=len({r["model_key"] for r in rows}))


def mape(law: Law, rows: list[dict[str, Any]], target: str) -> float:
    errors = [abs(law.predict(r, r["batch"]) - r[target]) / r[target] for r in rows]
    return float(sum(errors) / len(errors))


def folds(rows: list[dict[str, Any]], k: int = FOLDS) -> list[tuple[list[dict], list[dict]]]:
    """Grouped k-fold splits: every model's rows fall in one fold (models sorted by key, dealt round-robin)."""
    keys = sorted({r["model_key"] for r in rows})
    k = min(k, len(keys))
    fold_of = {key: i % k for i, key in enumerate(keys)}
    return [([r for r in rows if fold_of[r["model_key"]] != f], [r for r in rows if fold_of[r["model_key"]] == f])
            for f in range(k)]


def cv_mape(rows: list[dict[str, Any]], target: str, name: str, const: tuple[str, ...], per_sample: tuple[str, ...]) -> float | None:
    """Mean absolute percentage error on held-out models (None with fewer than 3 models)."""
    splits = folds(rows)
    if len(splits) < 3:
        return None
    errors, n = 0.0, 0
    for train, test in splits:
        law = fit_law(train, target, name, const, per_sample)
        errors += mape(law, test, target) * len(test)
        n += len(test)
    return errors / n


def select(rows: list[dict[str, Any]], target: str, laws: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> Law:
    """The candidate law with the lowest cross-validated error, fitted on all ``rows``.  Without
    enough models to cross-validate, the first (simplest) law."""
    if not rows:
        raise BankError(f"no rows with {target} to fit")
    scores = {name: cv_mape(rows, target, name, *parts) for name, parts in laws.items()}
    scored = {n: s for n, s in scores.items() if s is not None and math.isfinite(s)}
    best = min(scored, key=lambda n: (round(scored[n], 4), list(laws).index(n))) if scored else next(iter(laws))
    law = fit_law(rows, target, best, *laws[best])
    law.cv_mape, law.candidates = scores.get(best), scores
    return law


def trace_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with a first step: its extra time over a step (tracing, first allocations)."""
    out = []
    for r in rows:
        if r.get("first_step_s") is not None and r["first_step_s"] > r["step_s"]:
            out.append({**r, "trace_s": r["first_step_s"] - r["step_s"], "batch": 1})
    return out


Laws = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def usable(laws: Laws, columns: tuple[str, ...]) -> Laws:
    """The candidates whose optional columns are all among ``columns``."""
    return {name: parts for name, parts in laws.items() if set(parts[0] + parts[1]) & set(OPTIONAL) <= set(columns)}


def without_mix(laws: Laws) -> Laws:
    """The candidates that need no optional column."""
    return usable(laws, ())


def law_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The rows one device type's laws fit, and the optional columns its candidates may use (see
    the module docstring)."""
    rows = complete_steps(rows)
    enough = max(MIN_TIER_MODELS, len({r["model_key"] for r in rows}) / 2)
    for depth in range(len(OPTIONAL_TIERS), 0, -1):
        columns = tuple(k for tier in OPTIONAL_TIERS[:depth] for k in tier)
        have = [r for r in rows if has_columns(r, columns)]
        if len(have) == len(rows) or len({r["model_key"] for r in have}) >= enough:
            return have, columns
    return rows, ()


def fit_device(rows: list[dict[str, Any]]) -> dict[str, Law | None]:
    """The step-time, memory and tracing laws of one device type's rows (memory and tracing None
    when no row measured them)."""
    rows, columns = law_rows(rows)
    step = select(rows, "step_s", usable(STEP_LAWS, columns))
    memory_rows = [r for r in rows if r.get("peak_memory_bytes")]
    traced = trace_rows(rows)
    return {
        "step": step,
        "memory": select(memory_rows, "peak_memory_bytes", usable(MEMORY_LAWS, columns)) if memory_rows else None,
        "trace": select(traced, "trace_s", TRACE_LAWS) if traced else None,
    }


def fit_bank(rows: list[dict[str, Any]], kinds: tuple[str, ...] = ("sweep", "calibration", "run")) -> dict[str, dict[str, Any]]:
    """Per device key: its name and fitted laws, over the rows of ``kinds``."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] in kinds:
            by_key.setdefault(r["device_key"], []).append(r)
    if not by_key:
        raise BankError("the profile bank has no step-time rows; profile the pool first (the profile_pool DAG, or "
                        "`python -m pipelines profile --pool POOL --device NAME`)")
    return {key: {"device": rs[-1]["device"], **fit_device(rs)} for key, rs in by_key.items()}


def bank_report(uri: str) -> dict[str, Any]:
    """What ``python -m pipelines fit-bank`` prints: per device type, its rows and chosen laws with
    their cross-validated errors (a BankError when the bank is empty or bad)."""
    bank = ProfileBank(uri)
    fits = fit_bank(bank.steps())
    out: dict[str, Any] = {}
    for key, fit in fits.items():
        name = fit["device"] if fit["device"] not in out else f"{fit['device']}@{key[:8]}"
        step, memory, trace = fit["step"], fit["memory"], fit["trace"]
        out[name] = {
            "device_key": key, "rows": step.rows, "models": step.models,
            "step_model": step.name, "step_cv_mape": step.cv_mape,
            "memory_model": memory.name if memory else None, "memory_cv_mape": memory.cv_mape if memory else None,
            "trace_model": trace.name if trace else None, "laws": {k: v.to_dict() for k, v in fit.items() if isinstance(v, Law)},
        }
    return {"bank": bank.uri, "device_types": out}
