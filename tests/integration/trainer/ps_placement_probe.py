"""Run as a program by test_parameter_server.py: an in-process localhost cluster (one worker, two
parameter servers, this process the chief) builds the job's update for a sharded model, runs one,
and prints one JSON line with where the traced graph puts each op that touches a variable or an
optimizer slot, and what the update did to the weights.  A separate process, because TensorFlow's
in-process servers cannot be stopped."""

from __future__ import annotations

import json
import os
import sys

from pipelines.launch.local import free_ports


def main(optimizer: str) -> dict:
    import numpy as np
    import tensorflow as tf

    from pipelines.train.combiners import plain
    from pipelines.train.ps_cluster import strategy
    from pipelines.train.ps_server import Server, build_update, parse_record

    p = free_ports(4)
    cluster = {"chief": [f"127.0.0.1:{p[0]}"], "worker": [f"127.0.0.1:{p[1]}"],
               "ps": [f"127.0.0.1:{p[2]}", f"127.0.0.1:{p[3]}"]}
    spec = tf.train.ClusterSpec(cluster)
    servers = [tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc", start=True)
               for job in ("worker", "ps") for i in range(len(cluster[job]))]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    st = strategy(tf, 2)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(st)
    tf.keras.utils.set_random_seed(0)
    with st.scope():
        model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(3)])
    server = Server(st, model, optimizer)
    combine = plain(server, {})
    update = build_update(server, model, combine, "async", 4, 0.0, 1.0)
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    y = np.array([0, 1, 2, 1, 0], "int32")
    lr = 0.1
    graph = update.get_concrete_function(tf.constant(x), tf.constant(y), tf.constant(lr)).graph
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
    def whole():  # each layer's kernel and bias, its shards put together
        return [np.concatenate([s.numpy() for s in getattr(w, "variables", [w])])
                for layer in model.layers for w in (layer.kernel, layer.bias)]

    before = whole()
    # the gradient the update should push, computed here on the same weights
    local = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(3)])
    local.set_weights(before)
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, local(x, training=True))
    grads = [g.numpy() for g in tape.gradient(loss, local.trainable_variables)]
    record = coordinator.schedule(update, args=(tf.constant(x), tf.constant(y), tf.constant(lr)))
    r = parse_record(record.fetch())
    after = np.concatenate([w.ravel() for w in whole()])
    flat_before = np.concatenate([w.ravel() for w in before])
    # the first step from zero slots: SGD with momentum moves by lr * g; Adam by about lr * sign(g)
    expected = np.concatenate([(w - lr * g).ravel() for w, g in zip(before, grads, strict=True)])
    if optimizer == "adam":
        expected = np.concatenate([(w - lr * g / (np.abs(g) + 1e-7)).ravel() for w, g in zip(before, grads, strict=True)])
    del servers
    return {"touching": touching, "record": r, "variable_devices": sorted({v.device for v in server.variables}),
            "shards": len(server.variables), "weights": len(model.weights),
            "moved": float(np.abs(after - flat_before).max()), "max_error": float(np.abs(after - expected).max())}


if __name__ == "__main__":
    out = main(sys.argv[1] if len(sys.argv) > 1 else "sgd")
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the in-process servers and the coordinator's threads would keep the process alive
