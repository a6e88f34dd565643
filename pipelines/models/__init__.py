"""Named example models, and loading a user's model from ``"package.module:build_function"``.

A build function takes ``input_shape`` (tuple), ``num_classes`` (int) and its own keyword
arguments, and returns an uncompiled ``tf.keras.Model`` whose output is logits.  Whatever keeps
the model from being built raises one :class:`pipelines.errors.ModelError` naming ``model.name``,
the module and the cause (docs/ARCHITECTURE.md, "Failure rules").
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable
from typing import Any

from pipelines.core.imports import load_tensorflow
from pipelines.errors import ModelError

EXAMPLES: dict[str, str] = {
    "small_cnn": "pipelines.models.examples:small_cnn",
    "tiny_mlp": "pipelines.models.examples:tiny_mlp",
    "conv_net": "pipelines.models.examples:conv_net",
    "residual_cnn": "pipelines.models.examples:residual_cnn",
    "separable_cnn": "pipelines.models.examples:separable_cnn",
    "embedding_net": "pipelines.models.examples:embedding_net",
}


def cause(error: BaseException) -> str:
    """``Type: first line of the message at file:line``: the error and the innermost frame of
    Python code it was raised in (the user's file, not the import machinery's)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<")]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    first = (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}{where}"


def resolve_model(name: str) -> Callable[..., Any]:
    """Return the build function for an example name or a ``module:function`` reference."""
    ref = EXAMPLES.get(name, name)
    if ":" not in ref:
        raise ModelError(
            f"model.name {name!r}: unknown model; use one of {sorted(EXAMPLES)} or 'package.module:build_function'"
        )
    module_name, func_name = ref.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any error of the user's module (a SyntaxError too) is the model's
        raise ModelError(f"model.name {name!r}: cannot import module {module_name!r}: {cause(e)}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        where = getattr(module, "__file__", None) or module_name
        raise ModelError(f"model.name {name!r}: module {module_name!r} ({where}) has no callable {func_name!r}")
    return func


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, kwargs: dict | None = None):
    """Build the model, checking that it is a Keras model whose output has one logit per class;
    a :class:`ModelError` otherwise."""
    tf = load_tensorflow()  # before the user's module imports it (pipelines.core.imports)
    func = resolve_model(name)
    what = f"model.name {name!r}" + (f" ({EXAMPLES[name]})" if name in EXAMPLES else "")
    try:
        model = func(input_shape=tuple(input_shape), num_classes=num_classes, **(kwargs or {}))
    except Exception as e:  # whatever the user's build function raises is the model's error
        args = f" with model.kwargs {kwargs}" if isinstance(e, TypeError) and kwargs else ""
        raise ModelError(f"{what}: the build function{args} raised {cause(e)}") from None
    if not isinstance(model, tf.keras.Model):
        raise ModelError(f"{what}: the build function returned {type(model).__name__}, not a tf.keras.Model")
    try:
        out = tuple(model.output_shape)
    except (AttributeError, RuntimeError, TypeError, ValueError):  # a subclassed model never called
        raise ModelError(f"{what}: the model has no output shape; build it on a tf.keras.Input of input_shape "
                         "(functional or Sequential)") from None
    if not out or out[-1] != num_classes or isinstance(out[-1], tuple):
        raise ModelError(f"{what}: the model's output shape {out} does not end in dataset.num_classes="
                         f"{num_classes}: it needs one logit per class")
    return model
