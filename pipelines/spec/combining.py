"""The job spec's combiner fields (``training.combiner``, ``training.combiner_options``): their
types, descriptions and checks, kept out of :mod:`pipelines.spec.job` (docs/guide/training.md,
"Combiners").

A combiner's name, its factory's signature and its options are checked before any work starts,
without TensorFlow (the Airflow side imports the spec while parsing DAG files):
:func:`pipelines.train.combiners.resolve_combiner` imports a user's module, which registers its
names (``"package.module:name"``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo

from pipelines.spec.base import field_error
from pipelines.train.combiners import CombinerError, check_options, resolve_combiner

__all__ = ["Combiner", "CombinerOptions", "COMBINER_DOC", "COMBINER_OPTIONS_DOC"]

COMBINER_DOC = (
    'How a parameter server merges an update: "staleness_aware" (the default: its gradient weighed by '
    "min(1, (1 + s0) / (1 + its staleness)), so that a late gradient moves the parameters less; s0 is the option "
    "expected_staleness, by default N - 1 for N workers in bounded mode, whose updates come nearly in rounds, "
    '0 otherwise), "plain" (as it is), '
    '"window_average" (the sample-weighted mean of combine_window updates), "dc_asgd" '
    "(delay-compensated: g + lambda * g * g * (parameters now - parameters the worker read)), "
    '"drop_stale" (as plain, but an update more than max_staleness changes stale is dropped, its rows not trained '
    'again), a name registered with pipelines.train.combiners.register, or "package.module:name" (a factory in '
    "that module, or a name the module registers when imported). Checked before any work starts."
)
COMBINER_OPTIONS_DOC = (
    "Options for the combiner, given to its factory with the worker count (staleness_aware: expected_staleness; "
    "dc_asgd: lambda, adaptive, mean_square_momentum). Checked before any work starts when the combiner declares "
    "check_options; the keys window, max_staleness, workers and mode are the context's own."
)


def check_combiner(value: str) -> str:
    """``training.combiner``: a shipped or registered name, or a ``"package.module:name"`` that
    resolves to a factory of the documented signature (a module needing a library missing here
    is left to the trainer)."""
    try:
        resolve_combiner(value, strict=False)
    except CombinerError as e:
        raise field_error(str(e)) from None
    return value


def check_combiner_options(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """``training.combiner_options``, checked by the factory of ``training.combiner`` (declared
    before it, so validated first; absent when it was refused)."""
    name = info.data.get("combiner")
    try:
        factory = resolve_combiner(name, strict=False) if name else None
        check_options(str(name), factory, value)
    except CombinerError as e:
        raise field_error(str(e)) from None
    return value


Combiner = Annotated[str, AfterValidator(check_combiner)]
CombinerOptions = Annotated[dict[str, Any], AfterValidator(check_combiner_options), Field(
    description=COMBINER_OPTIONS_DOC)]
