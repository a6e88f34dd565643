"""Combiners: the rule by which a parameter server merges a worker's update into the parameters
(docs/ARCHITECTURE.md, "Parameter-server training").

A combiner is named in the spec (``training.combiner``): one of :data:`COMBINERS`, or a user's
``"package.module:function"``.  Either way it is a *factory*::

    def my_combiner(server, options):      # called once, before training, on the chief
        ...                                # create any state here (server.accumulator())
        def combine(update):               # traced into the update; runs under the servers'
            ...                            # lock, one update at a time, unless it is lock_free
            return changed                 # a bool tensor: did the parameters change?
        return combine

A ``combine`` that keeps no state between updates and always changes the parameters may say
``combine.lock_free = True``: in async mode it then runs without the lock, concurrently with other
updates (``server.apply`` is atomic per variable), as the shipped ``plain`` and ``staleness_aware``
do.

``server`` (``pipelines.train.ps_server.Server``) holds the parameters (``server.variables``) and
applies the job's optimizer with ``server.apply(gradients, learning_rate, gradient_scale=None)``
on the servers that hold the variables; ``server.accumulator()``
makes a sample-weighted running sum of updates.  ``update`` has ``gradients`` (aligned with
``server.variables``), ``learning_rate`` (the scheduled rate of this update), ``staleness`` (how
many parameter changes happened since the worker read the parameters), ``samples`` and
``worker``.  ``options`` is a dict: ``window`` (``training.combine_window``) and ``max_staleness``.

This module imports no TensorFlow at module level: the spec checks a combiner's name and its
factory's signature before any work starts (:func:`check_combiner`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

COMBINERS: dict[str, str] = {
    "plain": "pipelines.train.combiners:plain",
    "staleness_aware": "pipelines.train.combiners:staleness_aware",
    "window_average": "pipelines.train.combiners:window_average",
}


class CombinerError(ValueError):
    """A combiner name that does not resolve to a factory of the documented signature."""


def resolve_combiner(name: str, strict: bool = True) -> Callable[..., Any] | None:
    """The factory for a registered name or a ``"package.module:function"`` reference; a
    :class:`CombinerError` that names the value and what is wrong otherwise.  ``strict=False``
    (the spec's check) returns None for a module that exists but imports a library missing here."""
    ref = COMBINERS.get(name, name)
    if ":" not in ref:
        raise CombinerError(f"unknown combiner {name!r}: use one of {sorted(COMBINERS)} or 'package.module:function'")
    module_name, func_name = ref.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        own = e.name is not None and (module_name == e.name or module_name.startswith(e.name + "."))
        if not own and not strict:  # the module is there but needs a library this environment lacks
            return None  # (TensorFlow, on the Airflow side): the trainer's environment checks it
        raise CombinerError(f"combiner {name!r}: cannot import module {module_name!r}: {e}") from None
    except ImportError as e:
        raise CombinerError(f"combiner {name!r}: cannot import module {module_name!r}: {e}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise CombinerError(f"combiner {name!r}: module {module_name!r} has no callable {func_name!r}")
    check_factory(name, func)
    return func


def check_factory(name: str, func: Callable[..., Any]) -> None:
    """``func`` must be callable as ``func(server, options)``."""
    try:
        inspect.signature(func).bind(object(), {})
    except TypeError:
        raise CombinerError(
            f"combiner {name!r}: {getattr(func, '__name__', func)}{_signature(func)} cannot be called as "
            "factory(server, options); a combiner is a factory that takes the server and an options dict "
            "and returns combine(update)"
        ) from None
    except ValueError:  # a builtin without a signature: accept, it is checked when called
        return


def check_combine(name: str, combine: Any) -> Callable[..., Any]:
    """What the factory returned must be callable as ``combine(update)``."""
    if not callable(combine):
        raise CombinerError(f"combiner {name!r}: the factory returned {combine!r}, not a function combine(update)")
    try:
        inspect.signature(combine).bind(object())
    except TypeError:
        raise CombinerError(f"combiner {name!r}: the function it returned, {_signature(combine)}, cannot be "
                            "called as combine(update)") from None
    except ValueError:
        pass
    return combine


def _signature(func: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return "(...)"


# ------------------------------------------------------------------------------ the shipped ones


def plain(server, options: dict):
    """Apply every update as it arrives, at its scheduled learning rate."""

    def combine(update):
        return server.apply(update.gradients, update.learning_rate)

    combine.lock_free = True  # no state between updates, every update changes the parameters
    return combine


def staleness_aware(server, options: dict):
    """Apply every update with its gradient weighed down by its staleness τ: g / (1 + τ) enters
    the momentum (with Adam, which normalises a gradient's scale away, the step is scaled)."""
    import tensorflow as tf

    def combine(update):
        tau = tf.cast(update.staleness, tf.float32)
        return server.apply(update.gradients, update.learning_rate, gradient_scale=1.0 / (1.0 + tau))

    combine.lock_free = True
    return combine


def window_average(server, options: dict):
    """Average the updates of ``options["window"]`` arrivals, each weighted by its samples, and
    apply the average once.  The mean of W updates stands for W batches, so it moves at W times
    the completing update's rate (the linear scaling rule), as W plain updates would."""
    import tensorflow as tf

    window = int(options.get("window", 1))
    if window < 1:
        raise CombinerError(f"combiner 'window_average': window must be >= 1, got {window}")
    acc = server.accumulator("window_average")

    def combine(update):
        with tf.control_dependencies([acc.add(update.gradients, update.samples)]):
            full = acc.count() >= window

        def flush():
            with tf.control_dependencies([server.apply(acc.mean(), update.learning_rate * float(window))]):
                with tf.control_dependencies([acc.reset()]):
                    return tf.constant(True)

        return tf.cond(full, flush, lambda: tf.constant(False))

    return combine
