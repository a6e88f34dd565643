"""Benchmark: parameter-server apply throughput with one server against two, on a model whose
optimizer step dominates (issue 26, item 1: the step runs on the server that holds each shard,
with no global lock, so a second server should take half of it).

Run in the trainer environment::

    .venv-trainer/bin/python bench/ps_apply.py [--units 1536] [--layers 2] [--batch 4] [--updates 120] [--repeats 3]

The model is ``--layers`` dense layers of ``--units`` x ``--units`` (Adam: three model-sized
tensors per step on the servers) fed ``--batch`` rows, so a worker's forward and backward pass is
small beside the apply.  Every configuration starts real processes, as a job does: two workers
and one or two parameter servers (``python -m pipelines.train.ps``, serving until stopped), with
this process as the chief, which builds the job's update (``pipelines.train.ps_server``, combiner
``plain``, async mode) and keeps four updates in flight.  Per configuration, after ten updates of
warm-up, ``--updates`` updates are timed.  The configurations alternate (1, 2, 2, 1, ...) over
``--repeats`` so a drift of the host's speed favours neither.

The JSON line: ``updates_per_sec`` per server count (mean, ``_sd``, ``_per_repeat``),
``second_server_speedup`` (two servers' updates/s over one's, per repeat, then the mean, with
its sd), ``parameters``, ``cpus`` (this host's: on a host with fewer cores than the job's tasks,
the servers compete with the workers for them and a second server can gain little).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.core.imports import load_tensorflow  # noqa: E402
from pipelines.errors import EXIT_FAILED  # noqa: E402
from pipelines.launch.ports import free_ports  # noqa: E402
from pipelines.launch.tfconfig import ENV  # noqa: E402

WARMUP = 10
IN_FLIGHT = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--units", type=int, default=1536, help="width of each dense layer")
    p.add_argument("--layers", type=int, default=2, help="dense layers of units x units")
    p.add_argument("--batch", type=int, default=4, help="rows per update")
    p.add_argument("--updates", type=int, default=120, help="updates timed per configuration")
    p.add_argument("--repeats", type=int, default=3, help="times each server count is measured")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    args = p.parse_args(argv)
    for name in ("units", "layers", "batch", "updates", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def start_tasks(cluster: dict) -> list[subprocess.Popen]:
    """The workers and parameter servers as their own processes, as the local launcher starts them."""
    procs = []
    for role in ("worker", "ps"):
        for i in range(len(cluster[role])):
            env = {**os.environ, ENV: json.dumps({"cluster": cluster, "task": {"type": role, "index": i}}),
                   "TF_CPP_MIN_LOG_LEVEL": "2"}
            procs.append(subprocess.Popen([sys.executable, "-m", "pipelines.train.ps"], cwd=ROOT, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def measure(tf, servers: int, args) -> float:
    """Updates per second with ``servers`` parameter servers (after the warm-up)."""
    import numpy as np

    from pipelines.train.combiners import plain
    from pipelines.train.ps_cluster import strategy, wait_for_tasks
    from pipelines.train.ps_rows import prepare
    from pipelines.train.ps_server import Server, build_update

    ports = free_ports(3 + servers)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:3]],
               "ps": [f"127.0.0.1:{p}" for p in ports[3:]]}
    procs = start_tasks(cluster)
    try:
        os.environ[ENV] = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
        wait_for_tasks(cluster, timeout_s=120)
        st = strategy(tf, servers)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(st)
        with st.scope():
            model = tf.keras.Sequential([tf.keras.Input((args.units,))]
                                        + [tf.keras.layers.Dense(args.units) for _ in range(args.layers)]
                                        + [tf.keras.layers.Dense(10)])
        server = Server(st, model, args.optimizer, workers=len(cluster["worker"]))  # a clock per worker
        rng = np.random.default_rng(0)
        x = rng.normal(size=(args.batch, args.units)).astype("float32")
        y = rng.integers(0, 10, size=args.batch).astype("int32")
        store, _ = prepare(Path(tempfile.mkdtemp()) / "rows", x, y, (args.units,), "bench")  # the workers read it
        update = build_update(server, model, plain(server, {}), "async", 0, 0.0, 1.0, store)
        rows, lr = tf.constant(np.arange(args.batch), tf.int64), tf.constant(1e-4)

        def run(n: int) -> None:
            flight = []
            for _ in range(n):
                flight.append(coordinator.schedule(update, args=(rows, lr)))
                if len(flight) >= IN_FLIGHT:
                    flight.pop(0).fetch()
            for f in flight:
                f.fetch()

        run(WARMUP)
        t0 = time.perf_counter()
        run(args.updates)
        return args.updates / (time.perf_counter() - t0)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def one_configuration(servers: int, argv: list[str]) -> float:
    """One measurement in a fresh process: a coordinator cannot be torn down and built again."""
    proc = subprocess.run([sys.executable, __file__, "--_measure", str(servers), *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the {servers}-server measurement exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_measure"]:  # a child: one configuration
        servers, rest = int(argv[1]), argv[2:]
        tf = load_tensorflow()  # as the parameter-server tasks load it

        tf.get_logger().setLevel("ERROR")
        print(measure(tf, servers, parse_args(rest)), flush=True)
        sys.stdout.flush()
        os._exit(0)  # the coordinator's threads would keep the process alive
    args = parse_args(argv)
    params = args.layers * (args.units * args.units + args.units) + args.units * 10 + 10
    per = {1: [], 2: []}
    for r in range(args.repeats):
        for servers in ((1, 2) if r % 2 == 0 else (2, 1)):
            per[servers].append(one_configuration(servers, argv))
            print(f"repeat {r + 1}: {servers} server(s): {per[servers][-1]:.1f} updates/s", file=sys.stderr, flush=True)
    speedups = [b / a for a, b in zip(per[1], per[2], strict=True)]

    def sd(values: list[float]) -> float:
        return statistics.stdev(values) if len(values) > 1 else 0.0

    line = {
        "updates_per_sec": {str(k): round(statistics.mean(v), 2) for k, v in per.items()},
        "updates_per_sec_sd": {str(k): round(sd(v), 2) for k, v in per.items()},
        "updates_per_sec_per_repeat": {str(k): [round(x, 2) for x in v] for k, v in per.items()},
        "second_server_speedup": round(statistics.mean(speedups), 3),
        "second_server_speedup_sd": round(sd(speedups), 3),
        "second_server_speedup_per_repeat": [round(s, 3) for s in speedups],
        "parameters": params, "optimizer": args.optimizer, "units": args.units, "layers": args.layers,
        "batch": args.batch, "updates": args.updates, "repeats": args.repeats, "workers": 2,
        "cpus": len(os.sched_getaffinity(0)),
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:  # a measurement's processes failed: another try may succeed
        print(f"ERROR: {e}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
