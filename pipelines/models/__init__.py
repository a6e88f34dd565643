"""Named example models, and loading a user's model from ``"package.module:build_function"``.

A build function takes ``input_shape`` (tuple), ``num_classes`` (int) and its own keyword
arguments, and returns an uncompiled ``tf.keras.Model`` whose output is logits.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pipelines.errors import StageError

EXAMPLES: dict[str, str] = {
    "small_cnn": "pipelines.models.examples:small_cnn",
    "tiny_mlp": "pipelines.models.examples:tiny_mlp",
    "conv_net": "pipelines.models.examples:conv_net",
}


def resolve_model(name: str) -> Callable[..., Any]:
    """Return the build function for an example name or a ``module:function`` reference."""
    ref = EXAMPLES.get(name, name)
    if ":" not in ref:
        raise StageError(
            f"unknown model {name!r}: use one of {sorted(EXAMPLES)} or 'package.module:build_function'"
        )
    module_name, func_name = ref.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise StageError(f"model {name!r}: cannot import module {module_name!r}: {e}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise StageError(f"model {name!r}: {module_name!r} has no callable {func_name!r}")
    return func


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, kwargs: dict | None = None):
    """Build the model, checking that its output has one logit per class."""
    func = resolve_model(name)
    try:
        model = func(input_shape=tuple(input_shape), num_classes=num_classes, **(kwargs or {}))
    except TypeError as e:
        raise StageError(f"model {name!r}: bad keyword arguments {kwargs}: {e}") from None
    out = model.output_shape
    if out[-1] != num_classes:
        raise StageError(f"model {name!r}: output shape {out} does not end in num_classes={num_classes}")
    return model
