"""Run as a program by test_parameter_server.py: an in-process localhost cluster (one worker, two
parameter servers, this process the chief) builds the job's update for a sharded model, runs one,
and prints one JSON line with where the traced graph puts each op that touches a variable or an
optimizer slot, and what the update did to the weights.  With ``sync_round``: two workers add a
round's chunks, the chief triggers the round's apply, and the JSON line lists where TensorFlow
placed each of the apply's ops (its placement log) and what the round did to the weights.  With
``embedding``: one update of ``embedding_net`` (an ``Embedding``, whose gradient comes as
``tf.IndexedSlices``), where the traced update densifies it and what it did to the weights.  A
separate process, because TensorFlow's in-process servers cannot be stopped."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from pipelines.launch.ports import free_ports

# Every task's server runs in this process and shares its inter-op threads: with one per core on a
# two-core machine, two workers' updates waiting on their receives take them all, and hang.
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "8")


EMBEDDING = {"levels": 4, "dim": 3, "dense": []}  # embedding_net over 6 features: a 24 × 3 table, then the logits


def dense_model(tf):
    return tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(3)])


def embedding_model(tf):
    from pipelines.models import build_model

    return build_model("embedding_net", (6,), 3, EMBEDDING)


def cluster_of(tf, optimizer: str, mode: str, x, y, workers: int = 1, make=dense_model):
    """The in-process cluster (``workers`` workers, two servers), the coordinator, a sharded model
    (``make(tf)``), its server and update in ``mode`` over the rows ``x``, ``y`` (written as the
    workers' row store in a temporary folder); the servers are returned to keep them alive."""
    import tempfile

    from pipelines.train.combiners import plain
    from pipelines.train.ps_cluster import strategy
    from pipelines.train.ps_rows import prepare
    from pipelines.train.ps_server import Server, build_update, horovod_form

    p = free_ports(3 + workers)
    cluster = {"chief": [f"127.0.0.1:{p[0]}"], "worker": [f"127.0.0.1:{x}" for x in p[1 : 1 + workers]],
               "ps": [f"127.0.0.1:{x}" for x in p[1 + workers :]]}
    spec = tf.train.ClusterSpec(cluster)
    servers = [tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc", start=True)
               for job in ("worker", "ps") for i in range(len(cluster[job]))]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    st = strategy(tf, 2)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(st)
    tf.keras.utils.set_random_seed(0)
    with st.scope():
        model = make(tf)
    server = Server(st, model, optimizer, workers=workers, keras_momentum=horovod_form(mode, workers))  # as the chief
    combine = plain(server, {})
    store, _ = prepare(Path(tempfile.mkdtemp()) / "rows", x, y, x.shape[1:], "probe")
    update = build_update(server, model, combine, mode, 4, 0.0, 1.0, store)
    return servers, coordinator, model, server, combine, update


def whole(model) -> list:
    """Each layer's kernel and bias, its shards put together."""
    import numpy as np

    return [np.concatenate([s.numpy() for s in getattr(w, "variables", [w])])
            for layer in model.layers for w in (layer.kernel, layer.bias)]


def gradient(weights, x, y) -> list:
    """The mean loss's gradient on these rows, computed here on a local copy of the weights."""
    import tensorflow as tf

    local = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(3)])
    local.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, local(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, local.trainable_variables)]


def main(optimizer: str) -> dict:
    import numpy as np
    import tensorflow as tf

    from pipelines.train.ps_server import parse_record

    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    y = np.array([0, 1, 2, 1, 0], "int32")
    servers, coordinator, model, server, _, update = cluster_of(tf, optimizer, "async", x, y)
    lr = 0.1
    rows = tf.constant(np.arange(5), tf.int64)
    graph = update.get_concrete_function(rows, tf.constant(lr)).graph
    handles = {}  # the graph's placeholder for each captured handle -> (kind, the variable's device)
    slots = [s for group in server.slots.values() for s in group]
    for kind, variables in (("variable", server.variables), ("slot", slots)):
        for v in variables:
            for outer, inner in graph.captures:
                if outer is v.handle:
                    handles[inner.name] = (kind, v.device)
    touching = []
    for op in graph.get_operations():
        for t in op.inputs:
            if t.name in handles:
                kind, device = handles[t.name]
                touching.append({"op": op.type, "op_device": op.device, "kind": kind, "variable_device": device})
    before = whole(model)
    grads = gradient(before, x, y)  # the gradient the update should push
    record = coordinator.schedule(update, args=(rows, tf.constant(lr)))
    r = parse_record(record.fetch())
    after = np.concatenate([w.ravel() for w in whole(model)])
    flat_before = np.concatenate([w.ravel() for w in before])
    # the first step from zero slots: SGD with momentum moves by lr * g; Adam by about lr * sign(g)
    expected = np.concatenate([(w - lr * g).ravel() for w, g in zip(before, grads, strict=True)])
    if optimizer == "adam":
        expected = np.concatenate([(w - lr * g / (np.abs(g) + 1e-7)).ravel() for w, g in zip(before, grads, strict=True)])
    del servers
    return {"touching": touching, "record": r, "variable_devices": sorted({v.device for v in server.variables}),
            "shards": len(server.variables), "weights": len(model.weights),
            "moved": float(np.abs(after - flat_before).max()), "max_error": float(np.abs(after - expected).max())}


PLACED = re.compile(r"placer\.cc:\d+\] (\S+): \((\w+)\): (\S+)$")


def sync_round() -> dict:
    """A sync round of 10 rows in three chunks over two workers, then its apply, with TensorFlow
    logging where it places every op: the apply's placements (the log between two marks), the
    servers' devices, and how far the weights are from one SGD step on the mean gradient of the
    10 rows."""
    import tempfile

    out = os.dup(1)
    log = tempfile.TemporaryFile()  # TensorFlow's placement log: the C++ log (fd 2) and printf (fd 1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    import numpy as np
    import tensorflow as tf

    tf.debugging.set_log_device_placement(True)  # before the context connects to the cluster
    x = np.random.default_rng(1).normal(size=(10, 6)).astype("float32")
    y = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 1], "int32")
    servers, coordinator, model, server, combine, update = cluster_of(tf, "sgd", "sync", x, y, workers=2)
    apply_round = tf.function(lambda lr: server.apply_round(combine, lr))
    lr = 0.1
    before = whole(model)
    grads = gradient(before, x, y)
    os.write(2, b"\nUPDATES BEGIN\n")
    pending = [coordinator.schedule(update, args=(tf.constant(c, tf.int64), tf.constant(lr)))
               for c in np.array_split(np.arange(10), 3)]
    for p in pending:
        p.fetch()
    os.write(2, b"\nUPDATES END\n")
    os.write(2, b"\nROUND BEGINS\n")
    version = int(apply_round(tf.constant(lr, tf.float32)))
    os.write(2, b"\nROUND ENDS\n")
    after = np.concatenate([w.ravel() for w in whole(model)])
    expected = np.concatenate([(w - lr * g).ravel() for w, g in zip(before, grads, strict=True)])
    log.seek(0)
    text = log.read().decode(errors="replace")

    def placed_between(begin: str, end: str) -> list:
        inside = text[text.index(begin):text.index(end)]
        return [m.groups() for m in map(PLACED.search, inside.splitlines()) if m]

    placed, update_placed = placed_between("ROUND BEGINS", "ROUND ENDS"), placed_between("UPDATES BEGIN", "UPDATES END")
    del servers
    os.dup2(out, 1)
    return {"placed": placed, "update_placed": update_placed, "variable_devices": sorted({v.device for v in server.variables}),
            "shards": len(server.variables), "version": version,
            "moved": float(np.abs(after - np.concatenate([w.ravel() for w in before])).max()),
            "max_error": float(np.abs(after - expected).max())}


def embedding() -> dict:
    """One async update of ``embedding_net``, the table sharded over the two servers: the ops that
    turn an ``IndexedSlices`` gradient dense (``UnsortedSegmentSum``) with their devices in the
    traced update (a server's device: densified there, after every looked-up row travelled), the
    kinds of gradient the model's tape gives, and how far the weights are from one SGD step on the
    dense gradient computed here."""
    import numpy as np
    import tensorflow as tf

    from pipelines.train.ps_server import parse_record

    x = np.random.default_rng(2).normal(size=(5, 6)).astype("float32")
    y = np.array([0, 1, 2, 1, 0], "int32")
    servers, coordinator, model, server, _, update = cluster_of(tf, "sgd", "async", x, y, make=embedding_model)
    lr, rows = 0.5, tf.constant(np.arange(5), tf.int64)
    graph = update.get_concrete_function(rows, tf.constant(lr)).graph
    densify = [op.device for op in graph.get_operations() if op.type == "UnsortedSegmentSum"]
    local = embedding_model(tf)

    def joined() -> list:  # the model's shards (in order, along the first axis) as the local model's weights
        shards, out = iter(model.trainable_variables), []
        for v in local.trainable_variables:
            parts = [next(shards).numpy()]
            while sum(len(p) for p in parts) < v.shape[0]:
                parts.append(next(shards).numpy())
            out.append(np.concatenate(parts))
        return out

    local.set_weights(joined())
    before = [v.numpy() for v in local.trainable_variables]
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, local(x, training=True))
    grads = tape.gradient(loss, local.trainable_variables)
    kinds = sorted({type(g).__name__ for g in grads})
    r = parse_record(coordinator.schedule(update, args=(rows, tf.constant(lr))).fetch())
    after = joined()
    errors = [float(np.abs(a - (b - lr * tf.convert_to_tensor(g).numpy())).max())
              for a, b, g in zip(after, before, grads, strict=True)]
    moved = max(float(np.abs(a - b).max()) for a, b in zip(after, before, strict=True))
    del servers
    return {"densify_devices": densify, "gradient_kinds": kinds, "shards": len(server.variables),
            "version": r["version"], "moved": moved, "max_error": max(errors)}


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "sgd"
    out = {"sync_round": sync_round, "embedding": embedding}.get(which, lambda: main(which))()
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the in-process servers and the coordinator's threads would keep the process alive
