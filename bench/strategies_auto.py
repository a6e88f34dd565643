"""bench/strategies.py's check of ``training.strategy: auto``: would its choice between Horovod and
the parameter server have been the faster to the target loss?

``auto`` (the estimate stage) times both strategies on the same ranks, multiplies each run time
by the strategy's **epoch ratio** learned from earlier runs' loss curves (the bank's
``convergence`` table, ``pipelines.stores.convergence``), and keeps the one predicted to reach the
target loss first (``pipelines.estimate.runtime.pick_strategy``).  The check is held out, so that
nothing is judged on the runs it learned from:

1. **Learn from the first seed.**  Its ``horovod_balanced`` run (what a Horovod plan runs:
   balanced batches) and its run of the parameter server's default mode (``training.update_mode``'s
   default: ``ps_async``) are recorded in a profile bank of the work folder exactly as a finished
   pipeline run records them (``pipelines.stores.run_records.record_convergence``: the run's
   summary, under the pool key, model key and dataset the estimate stage uses).
2. **Predict.**  Each strategy's timed plan carries the estimate stage's fields, with the first
   seed's measured throughput as the prediction: ``predicted_samples_per_sec`` its steady
   samples/s, ``predicted_total_s`` (= ``predicted_loop_s``) the epochs' rows at that speed,
   ``predicted_step_s`` a step's rows (B for Horovod, an applied update's b for the parameter
   server) at that speed, ``ranks`` the run's devices and batches.  The parameter-server plan's
   ``ps`` detail, which only words the reason, is the planner's own
   (``pipelines.estimate.planner.score_ps_candidate``) from each device's standalone step at b in
   the first seed.  Then the stage's own calls: ``time_to_accuracy`` adds each plan's epoch ratio
   from the bank, ``pick_strategy(timed, "auto")`` picks.  The runs' specs carry
   ``training.target_loss`` = ``--target-loss`` (bench/strategies.py), so the ratio is taken
   where each curve reached the loss the judgement below uses.
3. **Judge on the later seeds.**  The pick is compared, seed by seed, with the configuration that
   reached ``--target-loss`` first (``strategies_stats.pick_agreement``).  The prediction uses the
   first seed only, so it is the same for every later seed: the question is whether one seed's
   measurements choose the strategy that is faster on seeds they have not seen.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipelines.estimate.calibrate import optimizer_slots  # noqa: E402
from pipelines.estimate.features import model_features  # noqa: E402
from pipelines.estimate.planner import PSConfig, score_ps_candidate  # noqa: E402
from pipelines.estimate.runtime import DEFAULT_LINK, pick_strategy  # noqa: E402
from pipelines.models import build_model  # noqa: E402
from pipelines.spec import TrainingSpec, load_pool, load_spec  # noqa: E402
from pipelines.stores.convergence import time_to_accuracy  # noqa: E402
from pipelines.stores.profile_bank import ProfileBank, features_key, pool_key  # noqa: E402
from pipelines.stores.run_records import record_convergence  # noqa: E402

HOROVOD = "horovod_balanced"  # the configuration a Horovod plan runs


def ps_default() -> str:
    """The configuration a parameter-server plan runs: the spec's default ``update_mode``."""
    return "ps_" + TrainingSpec.model_fields["update_mode"].default


def configuration_of(strategy: str) -> str:
    """The configuration that runs a plan of ``strategy``."""
    return HOROVOD if strategy == "horovod" else ps_default()


def model_identity(spec) -> tuple[dict, str]:
    """The model's features and bank key, as the estimate stage makes them (``_features``)."""
    model = build_model(spec.model.name, tuple(spec.dataset.feature_shape), spec.dataset.num_classes, spec.model.kwargs)
    features = {**model_features(model), "name": spec.model.name}
    return features, features_key(features, spec.training.optimizer)


def measured_plan(strategy: str, summary: dict, devices: list[str], samples_per_sec: float, rows_train: int) -> dict:
    """A timed plan of ``strategy`` whose prediction is a measured run's throughput (module
    docstring, step 2); ``devices``: rank i's device type (the trainer, run without a plan, calls
    them all ``default``)."""
    ps = summary.get("parameter_server")
    rows_per_step = int(ps["update_batch"]) if ps and ps["update_mode"] != "sync" else int(summary["global_batch"])
    total = int(summary["epochs"]) * rows_train / samples_per_sec
    return {"strategy": strategy, "global_batch": int(summary["global_batch"]), "epochs": int(summary["epochs"]),
            "ranks": [{"rank": r["rank"], "device": devices[r["rank"]], "batch": int(r["batch"])} for r in summary["ranks"]],
            "steps_per_epoch": math.ceil(rows_train / rows_per_step), "predicted_samples_per_sec": samples_per_sec,
            "predicted_step_s": rows_per_step / samples_per_sec, "predicted_total_s": total, "predicted_loop_s": total}


def ps_detail(pool, devices: list[str], standalone: dict[str, float], summary: dict, rows_train: int, training,
              param_bytes: float) -> dict:
    """The planner's parameter-server detail on these devices, each device's step at b being the
    one it measured alone (``standalone``: samples/s at b)."""
    b = int(summary["parameter_server"]["update_batch"])
    steps = {d: {"fixed_s": b / standalone[d], "per_sample_s": 0.0} for d in devices}
    config = PSConfig(update_mode=training.update_mode, max_staleness=training.max_staleness,
                      servers=training.parameter_servers, slots=optimizer_slots(training.optimizer))
    return score_ps_candidate([pool.get(d) for d in devices], steps, global_batch=int(summary["global_batch"]),
                              rows_train=rows_train, epochs=int(summary["epochs"]), latency_s=DEFAULT_LINK["latency_s"],
                              param_bytes=param_bytes, bandwidth_bps=DEFAULT_LINK["bandwidth_bps"], ps=config)["ps"]


def predict_pick(work: Path, pool_path: Path, runs: dict[str, dict], standalone: dict[str, float], rows_train: int,
                 seed: int) -> dict:
    """``auto``'s pick from the first seed's runs (``runs``: strategy to ``{spec, out,
    samples_per_sec}``, the spec and output folder of its configuration's run; ``standalone``: each
    device's samples/s alone, in rank order); ``{pick (the configuration), strategy, reason,
    strategies (pick_strategy's per-strategy figures), curves_recorded (strategy: whether the bank
    took its run's loss curve)}``."""
    specs = {s: load_spec(str(r["spec"])) for s, r in runs.items()}
    summaries = {s: json.loads((Path(r["out"]) / "summary.json").read_text()) for s, r in runs.items()}
    ps_spec, pool = specs["parameter_server"], load_pool(str(pool_path))
    features, model_key = model_identity(ps_spec)
    estimate = {"pool_key": pool_key(pool, "local"), "model": features, "model_key": model_key}
    shutil.rmtree(work / "bank", ignore_errors=True)  # this run's seed only (a kept folder may hold an older one's)
    bank = ProfileBank(str(work / "bank"))
    dataset = ps_spec.dataset.uri
    # as the pipeline does, a run whose curve says nothing (fewer than two windows) is not recorded:
    # without both curves the epoch ratio is not learned (1, said so in the reason)
    recorded = {s: record_convergence(bank, estimate, summary, f"seed{seed}/{configuration_of(s)}", dataset)
                for s, summary in summaries.items()}
    devices = list(standalone)  # the workers' devices, rank by rank
    timed = [measured_plan(s, summaries[s], devices, float(runs[s]["samples_per_sec"]), rows_train) for s in runs]
    ps_plan = next(p for p in timed if p["strategy"] == "parameter_server")
    ps_plan["ps"] = ps_detail(pool, [r["device"] for r in ps_plan["ranks"]], standalone, summaries["parameter_server"],
                              rows_train, ps_spec.training, features["param_bytes"])
    timed = time_to_accuracy(timed, bank.read("convergence"), estimate["pool_key"], model_key, dataset, ps_spec.training)
    chosen = pick_strategy(timed, "auto")
    return {"pick": configuration_of(chosen["strategy"]), "strategy": chosen["strategy"],
            "reason": chosen["strategy_reason"], "strategies": chosen["strategies"], "curves_recorded": recorded}
