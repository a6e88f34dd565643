"""Benchmark: day one on a new pool: how well the first run of a model nobody profiled is predicted.

Issue 25's "Day one on a new cluster".  A fresh profile bank; a pool of three device types of
one device each, with CPU limits of 1, 0.6 and 0.3 cores (``--shares``); the pool profiled as the
``profile_pool`` DAG does (a sweep of ``--size`` per device type, the allreduce probe,
``--references`` reference runs, the bank's fit); then ``--runs`` Horovod training runs of models
outside the sweep's family and other than the reference models (among them a residual CNN with
global average pooling and a wide MLP, at global batches 64, 128 and 256), each through the real
stages with ``estimate.calibrate: never``, so that it is predicted before it starts from the bank
alone.  Each model runs once: its error is that of its first run on the pool, and the estimate
stage's result is checked to have found no row of the model in the bank (``own_rows`` 0 on every
device type: no learning from its own earlier runs, nor from a sweep of it).  A run may learn from
the other models' earlier runs (analyze records every run in the bank and later estimates use the
pool's corrections from them), as in production.

The error is exactly bench/estimator.py's: analyze's ``prediction_error``, (predicted − actual) /
actual of the trainer's ``train_seconds``, the prediction being the estimate's plan's
``predicted_total_s``.

``--pool cluster`` (the default), in the Airflow environment: the test cluster of tests/cluster
(a real-HTTP API server whose kubelet runs pods as local processes, CPU limits as CFS quotas where
cgroups can be written), one node per device type, the type's pods placed there by a node
selector; ``airflow dags test profile_pool`` then ``airflow dags test train_pipeline`` for each
run, with ``launcher: kubernetes``, a fresh ``AIRFLOW_HOME`` (SQLite) and the bank on the
cluster's shared volume (bench/first_run_cluster.py)::

    .venv/bin/python bench/first_run.py [--pool cluster] [--size small] [--runs 6] [--out DIR]

``--pool local``, in the trainer environment: the same pool on this machine's local launcher
(core 1 for the full core, core 0 under quotas of 60% and 30% for the others), profiled and
trained through the same commands as the DAGs' local tasks (bench/first_run_local.py)::

    .venv-trainer/bin/python bench/first_run.py --pool local [--size small] [--runs 6] [--out DIR]

Prints each run as it ends and a table, writes ``bench.json`` in the work folder and ends with one
JSON line (keys in bench/README.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (model, kwargs, global batch): outside the family's grids (pipelines.estimate.family: residual
# filters from 8 or 16 doubling, MLP widths up to 512, CNN filters doubling) and not the reference
# models (pipelines.estimate.reference); the estimate stage's own_rows checks it on the bank.
RUNS: tuple[tuple[str, dict[str, Any], int], ...] = (
    ("residual_cnn", {"filters": [12, 24]}, 128),  # residual connections, global average pooling
    ("tiny_mlp", {"hidden": [1024]}, 256),  # a wide MLP
    ("conv_net", {"filters": [16, 32, 32], "dense": [64]}, 64),
    ("separable_cnn", {"filters": [12, 24, 48]}, 128),
    ("small_cnn", {"filters": [8, 16], "dense_units": 32}, 256),
    ("residual_cnn", {"filters": [8, 16, 32], "blocks": 2, "dense": [32]}, 64),
)
DEVICE_NAMES = ("fast", "medium", "slow")
SHARES = (1.0, 0.6, 0.3)
NODE_LABEL = "hetero.io/device"  # the cluster's nodes carry their device type under this label
GOALS = {"first_run_error_median": 0.15, "first_run_error_max": 0.25}


def pool_doc(shares: tuple[float, ...]) -> dict[str, Any]:
    """The three-type pool: one device each, ``shares`` CPU cores; locally the full core is core 1
    and the others share core 0 (0.6 + 0.3 of it); on Kubernetes ``limits.cpu`` in millicores,
    each type on its own node."""
    types = []
    for i, (name, share) in enumerate(zip(DEVICE_NAMES, shares, strict=True)):
        types.append({
            "name": name, "count": 1, "memory_gb": 4, "power_watts": round(65 * share, 1),
            "cost_per_hour": round(0.1 * share, 3),
            "local": {"cpus": [1 if i == 0 else 0], "cpu_share": share},
            "kubernetes": {"resources": {"cpu": f"{round(share * 1000)}m", "memory": "4Gi"},
                           "node_selector": {NODE_LABEL: name}},
        })
    return {"device_types": types}


def first_run_record(model: str, kwargs: dict, global_batch: int, estimate: dict, analyze: dict) -> dict[str, Any]:
    """One run's figures from its estimate and analyze results.  Raises RuntimeError when the
    estimate found rows of this very model in the bank: then it was not the model's first run."""
    own = {name: p.get("own_rows", 0) for name, p in (estimate.get("profiles") or {}).items()}
    if any(own.values()):
        raise RuntimeError(f"{model} {kwargs} was not new to the bank (its own rows per device type: {own}): "
                           "a first run must be predicted without them")
    return {"model": model, "kwargs": kwargs, "global_batch": global_batch,
            "predicted_s": round(analyze["predicted_total_s"], 3), "actual_s": round(analyze["actual_train_s"], 3),
            "error": round(analyze["prediction_error"], 4),
            "ranks": [r["device"] for r in (estimate.get("plan") or {}).get("ranks", [])]}


def summary(pool: str, shares: tuple[float, ...], measured: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON line."""
    runs = measured["runs"]
    errors = [abs(r["error"]) for r in runs]
    figures = {"first_run_error_median": round(statistics.median(errors), 4), "first_run_error_max": round(max(errors), 4)}
    return {
        "pool": pool,
        **figures,
        "goals_met": {key: figures[key] <= goal for key, goal in GOALS.items()},
        "runs": [{k: r[k] for k in ("model", "global_batch", "predicted_s", "actual_s", "error")} for r in runs],
        "global_batches": sorted({r["global_batch"] for r in runs}),
        "device_types": dict(zip(DEVICE_NAMES, shares, strict=True)),
        "profile_pool_seconds": measured["profile_pool_seconds"],
        "quota_enforced": measured["quota_enforced"],
        "bank": measured["bank"],
        "sweep_size": args.size, "references": args.references, "rows_per_day": args.rows_per_day, "days": 3,
        "epochs": 2, "seconds": measured["seconds"],
    }


def shares_arg(text: str) -> tuple[float, ...]:
    shares = tuple(float(x) for x in text.split(","))
    if len(shares) != len(DEVICE_NAMES) or not all(0 < s <= 1 for s in shares):
        raise argparse.ArgumentTypeError(f"three CPU shares in (0, 1], fastest first: {text!r}")
    return shares


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pool", choices=("cluster", "local"), default="cluster",
                   help="the test cluster (Airflow environment) or the local launcher (trainer environment) "
                   "(default: %(default)s)")
    p.add_argument("--size", default="small", help="the profile_pool sweep's size (default: %(default)s)")
    p.add_argument("--runs", type=int, default=len(RUNS), help=f"first runs, at most {len(RUNS)} (default: %(default)s)")
    p.add_argument("--references", type=int, choices=(0, 1, 2), default=2,
                   help="reference runs of profile_pool; on the cluster only 0 (off) or 2 (default: %(default)s)")
    p.add_argument("--rows-per-day", type=int, default=2000, help="sample rows a day of the runs' data, 3 days, "
                   "2 epochs (default: %(default)s)")
    p.add_argument("--shares", type=shares_arg, default=SHARES,
                   help="the three types' CPU cores, comma-separated (default: 1,0.6,0.3)")
    p.add_argument("--timeout", type=float, default=3600, help="cluster: seconds for each DAG run (default: %(default)s)")
    p.add_argument("--out", default=None, help="work folder (default: a new temporary folder)")
    args = p.parse_args()
    if not 1 <= args.runs <= len(RUNS):
        p.error(f"--runs: 1 to {len(RUNS)}")
    if args.pool == "cluster" and args.references == 1:
        p.error("--references: the profile_pool DAG on Kubernetes runs both reference models or none (0 or 2)")
    environment, needs = {"local": (".venv-trainer", "tensorflow"), "cluster": (".venv", "airflow")}[args.pool]
    if importlib.util.find_spec(needs) is None:
        p.error(f"--pool {args.pool} runs in the {environment} environment ({environment}/bin/python): no {needs} here")
    if args.pool == "local":
        from first_run_local import measure
    else:
        from first_run_cluster import measure
    work = Path(args.out or tempfile.mkdtemp(prefix="bench-first-run-"))
    work.mkdir(parents=True, exist_ok=True)
    pool = pool_doc(args.shares)
    measured = measure(args, pool, RUNS[: args.runs], work)
    (work / "bench.json").write_text(json.dumps({"pool": pool, **measured}, indent=1, default=str))
    print(f"\n{'model':14} {'kwargs':44} {'B':>4} {'predicted':>10} {'actual':>8} {'error':>7}  ranks")
    for r in measured["runs"]:
        print(f"{r['model']:14} {json.dumps(r['kwargs']):44} {r['global_batch']:4d} {r['predicted_s']:9.2f}s "
              f"{r['actual_s']:7.2f}s {100 * r['error']:+6.1f}%  {','.join(r['ranks'])}")
    print(json.dumps(summary(args.pool, args.shares, measured, args), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
