"""Combiners: the rule by which a parameter server merges a worker's update into the parameters
(docs/ARCHITECTURE.md, "Parameter-server training"; docs/guide/training.md, "Combiners").

A combiner is named in the spec (``training.combiner``): one of :data:`COMBINERS`, a name a
user's module registered with :func:`register`, or ``"package.module:name"``: the module is
imported, and ``name`` is a factory in it or a name it registered.  Either way it is a *factory*::

    @register("halve")                     # optional: makes "mymodule:halve" a registered name
    def my_combiner(server, context):      # called once, before training, on the chief
        ...                                # create any state here (server.accumulator())
        def combine(update):               # traced into the update; runs under the servers'
            ...                            # lock, one update at a time, unless it is lock_free
            return changed                 # a bool tensor: did the parameters change?
        return combine

A ``combine`` that keeps no state between updates and always changes the parameters may say
``combine.lock_free = True``: in async and bounded modes it then runs without the lock, concurrently with other
updates (``server.apply`` is atomic per variable), as the shipped ``plain`` and ``staleness_aware``
do.  A ``combine`` that says ``combine.drops = True`` means by a False "dropped" rather than "held"
(the shipped ``drop_stale``): the chief then counts the update as dropped.

``server`` (``pipelines.train.ps_server.Server``) holds the parameters (``server.variables``) and
applies the job's optimizer with ``server.apply(gradients, learning_rate, gradient_scale=None)``
on the servers that hold the variables; ``server.accumulator()`` makes a sample-weighted running
sum of updates; ``server.keep_reads(workers)`` makes every update carry the parameters its worker
read (``update.read``).  ``update`` has ``gradients`` (aligned with ``server.variables``),
``learning_rate`` (the scheduled rate of this update), ``staleness`` (how many parameter changes
happened since the worker read the parameters), ``samples``, ``worker``, ``version`` (the
parameter version the worker read) and ``read`` (the parameters it read, or None: see
``keep_reads``).  ``context`` is a :class:`CombinerContext`: a read-only mapping (so a factory
written for the earlier ``options`` dict keeps working) of ``window``, ``max_staleness``,
``workers``, ``mode`` and the user's ``training.combiner_options``.  A factory may carry
``factory.check_options(options)``, which the spec calls on ``training.combiner_options`` before any
work starts (raise ValueError naming the bad option).

This module imports no TensorFlow at module level: the spec checks a combiner's name, its
factory's signature and its options before any work starts (:func:`resolve_combiner`,
:func:`check_options`).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pipelines.core.imports import load_tensorflow

COMBINERS: dict[str, str] = {
    "plain": "pipelines.train.combiners:plain",
    "staleness_aware": "pipelines.train.combiners:staleness_aware",
    "window_average": "pipelines.train.combiners:window_average",
    "dc_asgd": "pipelines.train.combiners:dc_asgd",
    "drop_stale": "pipelines.train.combiners:drop_stale",
}
RESERVED = ("window", "max_staleness", "workers", "mode")  # the context's own keys
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")  # a registered name: no ':' (that is a module's)

# The names users' modules registered (register()), in this process: a module registers when it is
# imported, so the spec and the chief import it from "package.module:name".
_REGISTERED: dict[str, Callable[..., Any]] = {}


class CombinerError(ValueError):
    """A combiner name that does not resolve to a factory of the documented signature."""


class CombinerContext(Mapping):
    """What a factory is told about the job, as a read-only mapping and as attributes:
    ``workers`` (how many workers push updates), ``mode`` (``training.update_mode``), ``window``
    (``training.combine_window``), ``max_staleness`` and ``options`` (``training.combiner_options``,
    whose keys the mapping holds too; they may not reuse :data:`RESERVED`)."""

    def __init__(self, workers: int, mode: str = "async", window: int = 1, max_staleness: int = 0,
                 options: Mapping[str, Any] | None = None):
        self.workers, self.mode, self.window, self.max_staleness = int(workers), mode, int(window), int(max_staleness)
        self.options = dict(options or {})
        check_reserved(self.options)
        self._items = {"window": self.window, "max_staleness": self.max_staleness, "workers": self.workers,
                       "mode": self.mode, **self.options}

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"CombinerContext({self._items!r})"


def check_reserved(options: Mapping[str, Any]) -> None:
    clash = sorted(set(options) & set(RESERVED))
    if clash:
        raise CombinerError(f"combiner_options may not set {', '.join(clash)}: the context sets "
                            f"{', '.join(RESERVED)} from the training section (combine_window, max_staleness)")


def register(name: str, factory: Callable[..., Any] | None = None):
    """Register ``factory`` as the combiner ``name``; as ``@register(name)``, the function below it.
    Refused (:class:`CombinerError`): a name that is not ``[A-Za-z_][A-Za-z0-9_.-]*``, a shipped
    name, a name registered to another factory, and a factory that cannot be called as
    ``factory(server, context)``.  Registering the same function again (a module imported twice)
    is fine.  Returns the factory."""
    if factory is None:
        return lambda f: register(name, f)
    if not isinstance(name, str) or not NAME.match(name):
        raise CombinerError(f"cannot register combiner {name!r}: a name is letters, digits, '_', '.' and '-', "
                            "beginning with a letter or '_'")
    if name in COMBINERS:
        raise CombinerError(f"cannot register combiner {name!r}: a shipped combiner has that name")
    if not callable(factory):
        raise CombinerError(f"cannot register combiner {name!r}: {factory!r} is not a function")
    check_factory(name, factory)
    old = _REGISTERED.get(name)
    if old is not None and _where(old) != _where(factory):
        raise CombinerError(f"cannot register combiner {name!r} as {_where(factory)}: "
                            f"{_where(old)} is registered under that name")
    _REGISTERED[name] = factory
    return factory


def registered() -> list[str]:
    """The names registered in this process, sorted."""
    return sorted(_REGISTERED)


def _where(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}:{getattr(func, '__qualname__', repr(func))}"


def resolve_combiner(name: str, strict: bool = True) -> Callable[..., Any] | None:
    """The factory for a shipped or registered name or a ``"package.module:name"`` reference
    (``name`` a factory in the module or a name the module registers); a :class:`CombinerError`
    that names the value and what is wrong otherwise.  ``strict=False`` (the spec's check)
    returns None for a module that exists but imports a library missing here."""
    if name in _REGISTERED and name not in COMBINERS:
        return _REGISTERED[name]
    ref = COMBINERS.get(name, name)
    if ":" not in ref:
        raise CombinerError(f"unknown combiner {name!r}: use one of {sorted(COMBINERS) + registered()} or "
                            "'package.module:name' (a factory in that module, or a name it registers)")
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
    except CombinerError as e:  # its register() call refused
        raise CombinerError(f"combiner {name!r}: importing module {module_name!r}: {e}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        func = _REGISTERED.get(func_name)
    if not callable(func):
        raise CombinerError(f"combiner {name!r}: module {module_name!r} has no callable {func_name!r} "
                            "and registers no combiner of that name")
    check_factory(name, func)
    return func


def check_factory(name: str, func: Callable[..., Any]) -> None:
    """``func`` must be callable as ``func(server, context)``."""
    try:
        inspect.signature(func).bind(object(), {})
    except TypeError:
        raise CombinerError(
            f"combiner {name!r}: {getattr(func, '__name__', func)}{_signature(func)} cannot be called as "
            "factory(server, options); a combiner is a factory that takes the server and an options dict "
            "(its context) and returns combine(update)"
        ) from None
    except ValueError:  # a builtin without a signature: accept, it is checked when called
        return


def check_options(name: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """``training.combiner_options`` for this factory: no :data:`RESERVED` key, and whatever the
    factory's own ``check_options`` refuses (ValueError or TypeError), as a :class:`CombinerError`."""
    check_reserved(options)
    checker = getattr(factory, "check_options", None)
    if callable(checker):
        try:
            checker(dict(options))
        except (TypeError, ValueError) as e:
            raise CombinerError(f"combiner {name!r}: {e}") from None


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


def make_combiner(server, training, workers: int) -> Callable[..., Any]:
    """The job's ``combine``: the factory ``training.combiner`` names, its options checked, called
    with the server and the job's :class:`CombinerContext` (on the chief, before training)."""
    name = training.combiner
    factory = resolve_combiner(name)
    check_options(name, factory, training.combiner_options)
    context = CombinerContext(workers, training.update_mode, training.combine_window, training.max_staleness,
                              training.combiner_options)
    return check_combine(name, factory(server, context))


def _signature(func: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return "(...)"


# ------------------------------------------------------------------------------ the shipped ones


def plain(server, options: Mapping):
    """Apply every update as it arrives, at its scheduled learning rate."""

    def combine(update):
        return server.apply(update.gradients, update.learning_rate)

    combine.lock_free = True  # no state between updates, every update changes the parameters
    return combine


def staleness_aware(server, options: Mapping):
    """Apply every update with its gradient weighed down by its staleness τ beyond τ0:
    g * min(1, (1 + τ0) / (1 + τ)) enters the momentum, g / (1 + τ) where τ0 is 0 (with Adam, which
    normalises a gradient's scale away, the step is scaled).

    τ0 is the option ``expected_staleness`` (a number ≥ 0).  N busy workers' updates are N - 1
    changes stale on average, whatever their speeds (worker i's update lags by the others' updates
    while it computes), so τ0 = N - 1 weighs down only updates later than usual.  Its default:
    N - 1 in ``bounded`` mode, whose updates come nearly in rounds of N, each round a sync round applied in pieces (trained,
    like sync, with momentum 0.9 and a B-row step's rate); 0 otherwise (Zhang et al. 2016): in
    async mode τ0 = N - 1 diverged on one seed of three on 3 workers and changed nothing on 2
    (bench/README.md, "bench/strategies.py")."""
    tf = load_tensorflow()

    default = max(0, int(options.get("workers", 1)) - 1) if options.get("mode") == "bounded" else 0
    base = float(options.get("expected_staleness", default))

    def combine(update):
        tau = tf.cast(update.staleness, tf.float32)
        return server.apply(update.gradients, update.learning_rate,
                            gradient_scale=tf.minimum(1.0, (1.0 + base) / (1.0 + tau)))

    combine.lock_free = True
    return combine


def _check_staleness_aware(options: Mapping) -> None:
    unknown = sorted(set(options) - {"expected_staleness"})
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}: staleness_aware takes expected_staleness")
    if "expected_staleness" in options:
        value = options["expected_staleness"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise ValueError(f"expected_staleness must be a number >= 0, got {value!r}")


staleness_aware.check_options = _check_staleness_aware


def window_average(server, options: Mapping):
    """Average the updates of ``options["window"]`` arrivals, each weighted by its samples, and
    apply the average once.  The mean of W updates stands for W batches, so it moves at W times
    the completing update's rate (the linear scaling rule), as W plain updates would."""
    tf = load_tensorflow()

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


def drop_stale(server, options: Mapping):
    """Apply an update as ``plain`` does when its staleness τ is at most ``options["max_staleness"]``
    (``training.max_staleness``); drop it otherwise.  A dropped update changes nothing, and its rows
    are **not** trained again: they miss this epoch (the chief counts the update as dropped, in the
    result's ``dropped_updates`` and ``updates.jsonl``'s ``applied``).  This is what ``bounded``
    mode did before it became stale-synchronous; in ``bounded`` mode τ is already at most
    (N − 1)(2s + 1) (``pipelines.train.ps_clock``), so it drops only what lies between s and that."""
    tf = load_tensorflow()

    limit = int(options.get("max_staleness", 0))

    def combine(update):
        fresh = tf.cast(update.staleness, tf.int64) <= limit
        return tf.cond(fresh, lambda: tf.cast(server.apply(update.gradients, update.learning_rate), tf.bool),
                       lambda: tf.constant(False))

    combine.drops = True  # a False is a drop; not lock-free: the version is claimed only on a change
    return combine


DC_LAMBDA = 0.04  # DC-ASGD-c's λ in the paper's experiments (and MXNet's DCASGD default)
DC_LAMBDA_ADAPTIVE = 2.0  # DC-ASGD-a's λ0 in the paper's experiments
DC_MEAN_SQUARE_MOMENTUM = 0.95  # DC-ASGD-a's m
DC_EPSILON = 1e-7


def dc_asgd_options(options: Mapping) -> tuple[float, bool, float]:
    """``(λ, adaptive, m)`` from ``training.combiner_options``; ValueError naming a bad one."""
    known = {"lambda", "adaptive", "mean_square_momentum"}
    unknown = sorted(set(options) - known - set(RESERVED))
    if unknown:
        raise ValueError(f"unknown option {', '.join(unknown)}: dc_asgd takes {', '.join(sorted(known))}")
    adaptive = options.get("adaptive", False)
    if not isinstance(adaptive, bool):
        raise ValueError(f"option adaptive must be true or false, got {adaptive!r}")
    lam = options.get("lambda", DC_LAMBDA_ADAPTIVE if adaptive else DC_LAMBDA)
    if isinstance(lam, bool) or not isinstance(lam, int | float) or not 0 <= lam < 1e6:
        raise ValueError(f"option lambda must be a number >= 0, got {lam!r}")
    m = options.get("mean_square_momentum", DC_MEAN_SQUARE_MOMENTUM)
    if isinstance(m, bool) or not isinstance(m, int | float) or not 0 <= m < 1:
        raise ValueError(f"option mean_square_momentum must be a number in [0, 1), got {m!r}")
    return float(lam), adaptive, float(m)


def dc_asgd(server, options: Mapping):
    """Delay-compensated asynchronous SGD: DC-ASGD (S. Zheng, Q. Meng, T. Wang, W. Chen, N. Yu,
    Z.-M. Ma, T.-Y. Liu, "Asynchronous Stochastic Gradient Descent with Delay Compensation",
    ICML 2017, arXiv:1609.08326).

    A worker computed its gradient g at the parameters it read, w_read; by the time it arrives the
    parameters are w_now.  The paper estimates the gradient at w_now by a first-order Taylor
    expansion whose Hessian is approximated by the gradient's outer product (for a cross-entropy
    loss, an unbiased estimate of it), its diagonal only, times λ::

        g̃ = g + λ · g ⊙ g ⊙ (w_now − w_read)

    and its server applies g̃ (here the job's optimizer, ``server.apply``, on the servers that hold
    the variables: the compensation is computed there too, beside each variable).  ``w_read`` is
    the paper's ``w_bak(m)``, the copy the server keeps of what worker m last pulled
    (``server.keep_reads``).  Options (``training.combiner_options``):

    - ``lambda``: the variance control λ >= 0; 0.04 by default (the constant variant, DC-ASGD-c);
    - ``adaptive`` (false): DC-ASGD-a, λ_t = λ / sqrt(MeanSquare_t + ε) element-wise, with
      MeanSquare_t = m · MeanSquare_{t−1} + (1 − m) · g ⊙ g; λ (λ0) is then 2 by default;
    - ``mean_square_momentum``: that m, 0.95 by default.

    It runs under the servers' lock: w_now must not change between the compensation's read and
    the apply, and the adaptive variant keeps a mean square.  A sync round's mean (every worker
    read the same parameters) is applied as it is.
    """
    tf = load_tensorflow()

    lam, adaptive, m = dc_asgd_options(options)
    if options.get("mode") != "sync":  # a sync round's updates all read the same parameters
        server.keep_reads(int(options.get("workers", 1)))
    mean_square = server.zeros("dc_asgd_mean_square") if adaptive else None

    def combine(update):
        if update.read is None:
            return server.apply(update.gradients, update.learning_rate)
        compensated = []
        for i, (g, v, w_read) in enumerate(zip(update.gradients, server.variables, update.read, strict=True)):
            with tf.device(v.device):
                g = tf.cast(tf.convert_to_tensor(g), v.dtype)
                g2 = g * g
                scale = tf.constant(lam, v.dtype)
                if mean_square is not None:
                    ms = mean_square[i].assign(m * mean_square[i] + (1.0 - m) * g2)
                    scale = scale / tf.sqrt(ms + DC_EPSILON)
                compensated.append(g + scale * g2 * (v.read_value() - w_read))
        return server.apply(compensated, update.learning_rate)

    return combine


dc_asgd.check_options = dc_asgd_options
