"""Combiners: names and signatures refused before any work, and each shipped one's exact arithmetic
on one variable (docs/ARCHITECTURE.md, "Parameter-server training")."""

from __future__ import annotations

import sys
import types

import pytest

from pipelines.spec import SpecError, load_spec
from pipelines.train.combiners import COMBINERS, CombinerError, check_combine, resolve_combiner

BASE = {"dataset": {"uri": "data/x"}}


def spec_with(**training):
    return load_spec({**BASE, "training": {"strategy": "parameter_server", **training}})


def test_every_registered_name_resolves():
    for name in COMBINERS:
        assert callable(resolve_combiner(name))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("nope", "unknown combiner 'nope'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("json:no_such_function", "has no callable 'no_such_function'"),
        ("json:dumps", "cannot be called as factory(server, options)"),
    ],
)
def test_bad_combiners_fail_in_the_spec_naming_the_field(value, words):
    with pytest.raises(SpecError) as e:
        spec_with(combiner=value)
    assert "training.combiner" in str(e.value) and words in str(e.value)


def test_a_user_factory_is_accepted_and_its_combine_checked(monkeypatch):
    module = types.ModuleType("my_combiners_for_test")
    module.good = lambda server, options: (lambda update: True)
    module.bad_inner = lambda server, options: (lambda update, extra: True)
    monkeypatch.setitem(sys.modules, "my_combiners_for_test", module)
    assert spec_with(combiner="my_combiners_for_test:good").training.combiner == "my_combiners_for_test:good"
    factory = resolve_combiner("my_combiners_for_test:bad_inner")
    with pytest.raises(CombinerError, match="cannot be called as combine"):
        check_combine("my_combiners_for_test:bad_inner", factory(None, {}))


def test_a_module_needing_a_missing_library_is_left_to_the_trainer(tmp_path, monkeypatch):
    (tmp_path / "needs_lib_comb.py").write_text("import library_not_installed_xyz\n\ndef f(server, options):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert spec_with(combiner="needs_lib_comb:f").training.combiner == "needs_lib_comb:f"  # Airflow side: no TF
    with pytest.raises(CombinerError, match="library_not_installed_xyz"):
        resolve_combiner("needs_lib_comb:f")  # the trainer's check is strict


# ------------------------------------------------------------------ exact arithmetic, one variable

tf = pytest.importorskip("tensorflow")


class OneVariable:
    def __init__(self, value):
        self.trainable_variables = [tf.Variable(value, dtype=tf.float32)]


def server_with(combiner: str, optimizer="sgd", **options):
    from pipelines.train.ps_server import Server

    holder = OneVariable([1.0, -2.0])
    server = Server(tf.distribute.get_strategy(), holder, optimizer, workers=1)
    combine = check_combine(combiner, resolve_combiner(combiner)(server, {"window": 2, "max_staleness": 4, **options}))
    return server, combine, holder.trainable_variables[0]


def push(server, combine, grad, lr, staleness=0, samples=1.0, worker=0, admit=True):
    from pipelines.train.ps_server import Update

    update = Update([tf.constant(grad, tf.float32)], tf.constant(lr, tf.float32), tf.constant(staleness, tf.int64),
                    tf.constant(samples, tf.float32), tf.constant(worker, tf.int64))
    version = server.lock.execute(lambda: server.combined(combine, update, tf.constant(admit)))
    return admit, int(version)


def test_plain_applies_sgd_with_momentum_exactly():
    server, combine, w = server_with("plain")
    assert push(server, combine, [0.5, 1.0], lr=0.1, staleness=3) == (True, 1)
    assert w.numpy().tolist() == pytest.approx([1.0 - 0.05, -2.0 - 0.1])  # m = g: w -= lr * g, staleness ignored
    push(server, combine, [0.5, 1.0], lr=0.1)
    # m = 0.9 * g + g = 1.9 g
    assert w.numpy().tolist() == pytest.approx([0.95 - 0.1 * 0.95, -2.1 - 0.1 * 1.9])


def test_staleness_aware_divides_the_step_by_one_plus_staleness():
    server, combine, w = server_with("staleness_aware")
    push(server, combine, [0.8, -0.4], lr=0.5, staleness=3)
    assert w.numpy().tolist() == pytest.approx([1.0 - 0.5 / 4 * 0.8, -2.0 + 0.5 / 4 * 0.4])
    server2, combine2, w2 = server_with("staleness_aware")
    push(server2, combine2, [0.8, -0.4], lr=0.5, staleness=0)
    assert w2.numpy().tolist() == pytest.approx([1.0 - 0.4, -2.0 + 0.2])


def test_in_bounded_mode_staleness_aware_spares_the_n_minus_1_changes_of_a_round():
    from pipelines.train.combiners import CombinerContext

    for mode, staleness, scale in (("bounded", 2, 1.0), ("bounded", 5, 0.5), ("async", 2, 1 / 3)):
        server, combine, w = server_with("staleness_aware", **CombinerContext(3, mode, 1, 4))
        push(server, combine, [0.8, -0.4], lr=0.5, staleness=staleness)
        assert w.numpy().tolist() == pytest.approx([1.0 - 0.5 * scale * 0.8, -2.0 + 0.5 * scale * 0.4]), (mode, staleness)


def test_staleness_aware_with_an_expected_staleness_weighs_only_the_staleness_beyond_it():
    """expected_staleness 2 (what 3 busy workers make on average): an update 2 changes stale moves
    fully, one 5 stale by (1 + 2) / (1 + 5)."""
    for staleness, scale in ((0, 1.0), (2, 1.0), (5, 0.5)):
        server, combine, w = server_with("staleness_aware", expected_staleness=2)
        push(server, combine, [0.8, -0.4], lr=0.5, staleness=staleness)
        assert w.numpy().tolist() == pytest.approx([1.0 - 0.5 * scale * 0.8, -2.0 + 0.5 * scale * 0.4]), staleness


@pytest.mark.parametrize(("options", "words"), [
    ({"expected_staleness": -1}, "expected_staleness must be a number >= 0, got -1"),
    ({"expected_staleness": "two"}, "expected_staleness must be a number >= 0, got 'two'"),
    ({"expected_stalenes": 1}, "unknown option(s) expected_stalenes"),
])
def test_staleness_aware_options_are_checked_in_the_spec(options, words):
    with pytest.raises(SpecError) as e:
        spec_with(update_mode="async", combiner="staleness_aware", combiner_options=options)
    assert words in str(e.value), str(e.value)


def test_staleness_aware_weighs_the_gradient_not_the_momentum_already_there():
    server, combine, w = server_with("staleness_aware")
    push(server, combine, [1.0, 0.0], lr=0.1, staleness=0)  # m = g1
    push(server, combine, [0.0, 2.0], lr=0.1, staleness=3)  # m = 0.9 g1 + g2 / 4, not (0.9 g1 + g2) / 4
    m = [0.9 * 1.0, 2.0 / 4]
    assert w.numpy().tolist() == pytest.approx([1.0 - 0.1 - 0.1 * m[0], -2.0 - 0.1 * m[1]])


def test_adam_staleness_aware_scales_the_step():
    server, combine, w = server_with("staleness_aware", optimizer="adam")
    ref = tf.Variable([1.0, -2.0])
    keras = tf.keras.optimizers.Adam(learning_rate=0.01 / 4)
    push(server, combine, [0.5, 1.0], lr=0.01, staleness=3)
    keras.apply_gradients([(tf.constant([0.5, 1.0]), ref)])
    assert w.numpy().tolist() == pytest.approx(ref.numpy().tolist(), rel=1e-5)


def test_the_shipped_plain_and_staleness_aware_run_without_the_lock_and_window_average_with_it():
    from pipelines.train.ps_server import lock_free

    assert lock_free(server_with("plain")[1]) and lock_free(server_with("staleness_aware")[1])
    assert not lock_free(server_with("window_average")[1])
    assert not lock_free(lambda update: True)  # a user's combiner runs under the lock unless it says so


def test_window_average_applies_the_sample_weighted_mean_once_per_window():
    server, combine, w = server_with("window_average", window=2)
    assert push(server, combine, [1.0, 0.0], lr=0.1, samples=1.0) == (True, 0)  # admitted, held: no change yet
    assert w.numpy().tolist() == [1.0, -2.0]
    assert push(server, combine, [0.0, 2.0], lr=0.1, samples=3.0) == (True, 1)
    mean = [(1 * 1.0 + 3 * 0.0) / 4, (1 * 0.0 + 3 * 2.0) / 4]
    # the mean of 2 updates moves at the rate for their 2 batches: 2 * lr
    assert w.numpy().tolist() == pytest.approx([1.0 - 0.2 * mean[0], -2.0 - 0.2 * mean[1]])
    assert push(server, combine, [4.0, 4.0], lr=0.1, samples=2.0) == (True, 1)  # a new window begins empty


def test_drop_stale_applies_a_fresh_update_as_plain_and_drops_a_stale_one():
    from pipelines.train.ps_server import lock_free

    server, combine, w = server_with("drop_stale")  # max_staleness 4
    assert push(server, combine, [0.5, 1.0], lr=0.1, staleness=5) == (True, 0)  # dropped: no change, no version
    assert w.numpy().tolist() == [1.0, -2.0] and server.slots["momentum"][0].numpy().tolist() == [0.0, 0.0]
    assert push(server, combine, [0.5, 1.0], lr=0.1, staleness=4) == (True, 1)  # at the limit: applied as plain
    assert w.numpy().tolist() == pytest.approx([1.0 - 0.05, -2.0 - 0.1])
    assert combine.drops and not lock_free(combine)  # the chief counts a False as a drop; it runs under the lock


def test_a_refused_update_changes_nothing():
    server, combine, w = server_with("plain")
    assert push(server, combine, [0.5, 1.0], lr=0.1, admit=False) == (False, 0)
    assert w.numpy().tolist() == [1.0, -2.0]


def test_adam_on_the_server_matches_keras_adam():
    server, combine, w = server_with("plain", optimizer="adam")
    ref = tf.Variable([1.0, -2.0])
    keras = tf.keras.optimizers.Adam(learning_rate=0.01)
    for g in ([0.5, 1.0], [-0.2, 0.3], [0.1, 0.1]):
        push(server, combine, g, lr=0.01)
        keras.apply_gradients([(tf.constant(g), ref)])
    assert w.numpy().tolist() == pytest.approx(ref.numpy().tolist(), rel=1e-5)


def test_adam_without_the_lock_takes_its_step_count_in_the_counters_section_and_matches_keras():
    """The lock-free path (async with plain or staleness_aware): Adam's t comes from the counters'
    critical section, one per update; under the global lock it is a plain add (entering a
    critical section inside another one would deadlock, as the pushes above do)."""
    from pipelines.train.ps_server import Update

    server, combine, w = server_with("plain", optimizer="adam")
    server.locked = False
    ref = tf.Variable([1.0, -2.0])
    keras = tf.keras.optimizers.Adam(learning_rate=0.01)
    for g in ([0.5, 1.0], [-0.2, 0.3]):
        update = Update([tf.constant(g)], tf.constant(0.01), tf.constant(0, tf.int64), tf.constant(1.0),
                        tf.constant(0, tf.int64))
        server.claimed(combine, tf.constant(0, tf.int64), update.gradients, update.learning_rate, update.samples,
                       update.worker)
        keras.apply_gradients([(tf.constant(g), ref)])
    assert int(server.iterations.numpy()) == 2 and int(server.version.numpy()) == 2
    assert w.numpy().tolist() == pytest.approx(ref.numpy().tolist(), rel=1e-5)


@pytest.mark.parametrize(("keras", "expected"), [(True, 0.961), (False, 0.952)])
def test_the_servers_sgd_keeps_the_ranks_momentum_form_when_told(keras, expected):
    """A gradient of 1 at a rate of 0.01, then 0.02: Keras's form (the Horovod ranks' SGD:
    accum = 0.9 accum - lr g; w += accum) ends at 0.99 - (0.009 + 0.02) = 0.961; the other
    (accum = 0.9 accum + g; w -= lr accum) at 0.99 - 0.02 x 1.9 = 0.952.  The two differ only
    when the rate changes, as under warm-up and cosine decay."""
    from pipelines.sync.step import make_optimizer
    from pipelines.train.ps_server import Server

    holder = OneVariable([1.0])
    server = Server(tf.distribute.get_strategy(), holder, "sgd", workers=1, keras_momentum=keras)
    rank = tf.Variable([1.0])
    sgd = make_optimizer("sgd", 0.5)  # what a Horovod rank trains with
    for lr in (0.01, 0.02):
        server.apply([tf.constant([1.0])], tf.constant(lr))
        sgd.learning_rate.assign(lr)
        sgd.apply_gradients([(tf.constant([1.0]), rank)])
    assert holder.trainable_variables[0].numpy()[0] == pytest.approx(expected)
    assert (rank.numpy()[0] == pytest.approx(expected)) == keras  # the ranks' SGD: Keras's form


@pytest.mark.parametrize(("mode", "workers", "keras"), [("sync", 3, True), ("async", 1, True), ("bounded", 1, True),
                                                        ("async", 2, False), ("bounded", 3, False)])
def test_sync_jobs_and_one_worker_take_the_ranks_form(mode, workers, keras):
    from pipelines.train.ps_server import horovod_form

    assert horovod_form(mode, workers) is keras
