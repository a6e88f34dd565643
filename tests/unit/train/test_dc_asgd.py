"""DC-ASGD's delay compensation, exactly: g + λ · g ⊙ g ⊙ (w_now − w_read) applied by the servers'
optimizer, against the same arithmetic in NumPy (pipelines/train/combiners.py, ``dc_asgd``)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.train.combiners import CombinerContext, check_combine, resolve_combiner

tf = pytest.importorskip("tensorflow")

W0 = np.array([1.0, -2.0, 0.5], np.float32)
MOMENTUM = 0.9  # the servers' SGD momentum


class OneVariable:
    def __init__(self, value):
        self.trainable_variables = [tf.Variable(value, dtype=tf.float32)]


def dc_server(workers=2, **options):
    from pipelines.train.ps_server import Server

    holder = OneVariable(W0)
    server = Server(tf.distribute.get_strategy(), holder, "sgd", workers=workers)
    context = CombinerContext(workers, "async", 1, 4, options)
    combine = check_combine("dc_asgd", resolve_combiner("dc_asgd")(server, context))
    return server, combine, holder.trainable_variables[0]


def reads(server, worker):
    """What a worker's update does as it pulls the parameters: copy them for it on the servers."""
    server.copy_reads(tf.constant(worker, tf.int64))


def push(server, combine, worker, grad, lr, sync_round=False):
    """One update of ``worker`` with ``grad``, combined under the lock as build_update does."""
    from pipelines.train.ps_server import Update

    read = None if sync_round else server.read_by(tf.constant(worker, tf.int64))
    update = Update([tf.constant(grad, tf.float32)], tf.constant(lr, tf.float32), tf.constant(0, tf.int64),
                    tf.constant(1.0), tf.constant(worker, tf.int64), tf.constant(0, tf.int64), read)
    return int(server.lock.execute(lambda: server.combined(combine, update, tf.constant(True))))


def test_the_stale_update_is_compensated_by_what_changed_since_its_worker_read():
    lam, lr = 0.5, 0.1
    server, combine, w = dc_server(**{"lambda": lam})
    g1, g0 = np.array([0.3, -0.6, 1.2], np.float32), np.array([0.8, 0.4, -1.5], np.float32)
    reads(server, 0)  # both workers read W0
    reads(server, 1)
    assert push(server, combine, 1, g1, lr) == 1  # worker 1 first: nothing changed since it read, g as it is
    w1 = W0 - lr * g1
    np.testing.assert_allclose(w.numpy(), w1, rtol=1e-6)
    assert push(server, combine, 0, g0, lr) == 2  # worker 0 read W0; the parameters are now w1
    compensated = g0 + lam * g0 * g0 * (w1 - W0)
    accum = MOMENTUM * g1 + compensated
    np.testing.assert_allclose(w.numpy(), w1 - lr * accum, rtol=1e-6)
    assert not np.allclose(compensated, g0)  # the compensation did change the gradient


def test_each_worker_has_its_own_copy_of_what_it_read():
    server, combine, w = dc_server(workers=3, **{"lambda": 1.0})
    reads(server, 2)
    reads(server, 0)
    push(server, combine, 0, np.ones(3, np.float32), 0.1)
    reads(server, 1)  # worker 1 reads after the change; worker 2's copy stays W0
    np.testing.assert_allclose(server.read_by(tf.constant(2))[0].numpy(), W0)
    np.testing.assert_allclose(server.read_by(tf.constant(1))[0].numpy(), w.numpy())


def test_the_adaptive_variant_divides_lambda_by_the_root_mean_square():
    lam, m, lr = 2.0, 0.95, 0.05
    server, combine, w = dc_server(adaptive=True)  # λ0 = 2 and m = 0.95 by default
    g1, g0 = np.array([0.3, -0.6, 1.2], np.float32), np.array([0.8, 0.4, -1.5], np.float32)
    reads(server, 0)
    reads(server, 1)
    push(server, combine, 1, g1, lr)  # the mean square is updated by every update
    ms = (1 - m) * g1 * g1
    w1 = W0 - lr * g1
    push(server, combine, 0, g0, lr)
    ms = m * ms + (1 - m) * g0 * g0
    compensated = g0 + lam / np.sqrt(ms + 1e-7) * g0 * g0 * (w1 - W0)
    np.testing.assert_allclose(w.numpy(), w1 - lr * (MOMENTUM * g1 + compensated), rtol=1e-5)
    np.testing.assert_allclose(server.state["dc_asgd_mean_square"][0].numpy(), ms, rtol=1e-5)
    assert "state_dc_asgd_mean_square_0" in server.trackables()  # checkpointed with the rest


def test_a_sync_rounds_mean_is_applied_as_it_is():
    server, combine, w = dc_server(**{"lambda": 1.0})
    reads(server, 0)
    push(server, combine, 0, np.ones(3, np.float32), 0.1)
    g = np.array([0.5, 0.5, 0.5], np.float32)
    before = w.numpy()
    push(server, combine, -1, g, 0.1, sync_round=True)
    np.testing.assert_allclose(w.numpy(), before - 0.1 * (MOMENTUM * 1.0 + g), rtol=1e-6)


def test_dc_asgd_runs_under_the_lock():
    from pipelines.train.ps_server import lock_free

    assert not lock_free(dc_server()[1])
