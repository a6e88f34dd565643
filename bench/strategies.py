"""Benchmark: Horovod (equal and balanced batches) against parameter-server training (async,
bounded, sync) on the same devices, the same model, data and number of samples.

Run in the trainer environment::

    .venv-trainer/bin/python bench/strategies.py [--workers 2|3] [--rows 12000] [--epochs 3] [--global-batch 512] [--seeds 3]

**Devices** (N = ``--workers``): fast is core 1 at a full core; slow is core 0 at a
``--slow-share`` CPU quota (40%); with 3 workers, medium is core 0 too, at ``--medium-share``
(60%): on a 2-core machine medium and slow share core 0, each capped by its own quota.  Quotas
are cgroup CPU quotas and need a writable cgroup CPU controller; the line's ``quota_enforced``
says whether every launch (and every range test) could set them, as the launcher reports it.
Every configuration trains the real program from scratch for the same epochs (so the same
samples): Horovod ranks through the local launcher (``horovod_equal``: B split equally;
``horovod_balanced``: the trainer calibrates and re-balances as in a real run), or a chief, a
worker per device and one parameter server (``ps_async``, ``ps_bounded``, ``ps_sync``).  Each
device then trains alone at the workers' per-update batch b = B // N (the standalone runs).

**Schedule**: the job spec's defaults (``training.lr_schedule`` and ``training.warmup_epochs``
of ``pipelines.spec``; the line says which); ``--schedule constant`` sets a constant rate
without warm-up instead.

**Rates** (``--rates lr_search``, the default): every configuration gets its rate from the
project's ``lr_search`` stage, run once per family with the first seed (bench/strategies_rates.py):
Horovod and ``ps_sync`` (a step is B rows) from the range test on the devices' ranks, B split
equally; ``ps_async`` and ``ps_bounded`` (an update is b rows applied alone) from the range test
as one rank at batch b on the fast device, its rate r_b written into the spec at B by the trainer's
linear-scaling rule, ``scaled_learning_rate(r_b, b, B)`` = r_b × B / b, which the chief scales
back to r_b for each update.  ``--rates fixed`` gives every configuration ``--learning-rate``.

**Bounded s** (``--max-staleness auto``, the default): below the largest staleness async reaches,
so that the bound is tighter than what async does unbounded: s = max(1, floor(median of the async
runs' ``max_staleness_seen`` so far) − 1), "so far" being every async run before this bounded run
(a seed's async run comes first in forward order; in a reversed seed the earlier seeds' runs
count).  The line gives s per seed (``max_staleness``) and whether the bounded run waited
(``bounded_waited``: an update arrived more than s clocks ahead of the slowest worker,
``clock_waits``, or gave up waiting, ``deferred_updates``).

**Auto**: whether ``strategy: auto``'s pick, learned from the first seed's runs (their loss curves
recorded as the pipeline records them, their throughput as the prediction), reached the target
loss first in every later seed: held out, no seed judges what it taught (bench/strategies_auto.py).

Per configuration the line gives ``samples_per_sec`` (steady windows, the first, which traces,
left out), ``seconds_to_target_loss`` (training time until a window's mean loss first reaches
``--target-loss``; null when it never does), ``holdout_accuracy`` (the exported SavedModel on the
held-out rows) and ``final_loss``.  At the top level: ``async_vs_standalone_sum``, async
throughput over the sum of the N devices' standalone throughputs (goal >= 0.90);
``async_accuracy_gap`` / ``bounded_accuracy_gap``, Horovod balanced held-out accuracy minus the
mode's (goal <= 0.01); ``auto_picks_faster_to_accuracy`` (goal true); ``auto_pick_regret``, how
much later the pick reached the target on average over the later seeds than the faster
configuration (0 when it is the faster; ``strategies_stats.pick_regret``); ``goals``.

**Seeds** (``--seeds N``: 1..N, or ``--seed-list``): the job spec's ``training.seed``, which sets
the initial weights and every epoch's order of the rows.  A seed's runs follow each other in the
order above for the first seed, reversed for the second, and so on, so that a drift of the host's
speed favours none.  Each figure is its mean over the seeds, with ``<key>_sd`` (sample standard
deviation) and ``<key>_per_seed``; the ratios and gaps are computed within each seed, then
averaged (bench/strategies_stats.py).  Prints a Markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import strategies_rates as rates_  # noqa: E402
from strategies_auto import HOROVOD, predict_pick, ps_default  # noqa: E402
from strategies_stats import (  # noqa: E402
    aggregate,
    bounded_staleness,
    goals,
    pick_agreement,
    pick_regret,
    run_order,
    seed_figures,
    seed_list,
    table,
)

from hetero import prepare  # noqa: E402
from pipelines.errors import EXIT_DIVERGED  # noqa: E402
from pipelines.launch.local import Profile, launch, launch_ps  # noqa: E402
from pipelines.launch.ports import free_ports  # noqa: E402
from pipelines.launch.tfconfig import cluster_spec  # noqa: E402
from pipelines.models.evaluate import evaluate as holdout  # noqa: E402
from pipelines.spec import TrainingSpec  # noqa: E402
from pipelines.sync.balance import split_proportional  # noqa: E402
from pipelines.train.ps_chief import server_momentum  # noqa: E402

CONFIGURATIONS = ("horovod_equal", "horovod_balanced", "ps_async", "ps_bounded", "ps_sync")
PS_MODES = {"ps_async": "async", "ps_bounded": "bounded", "ps_sync": "sync"}


def momentum_arg(value: str) -> float | str:
    """``--async-momentum``: what ``training.async_momentum`` accepts (``auto`` or a number in [0, 1)),
    checked by the spec itself."""
    try:
        return TrainingSpec(async_momentum=value).async_momentum
    except ValueError:  # pydantic's ValidationError
        raise argparse.ArgumentTypeError(f"must be in [0, 1) or auto, got {value!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, choices=(2, 3), default=2, help="devices: fast, slow (2) or fast, medium, "
                   "slow (3) (default: %(default)s)")
    p.add_argument("--rows", type=int, default=12000, help="training rows of the sample task (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="epochs every configuration trains (default: %(default)s)")
    p.add_argument("--global-batch", type=int, default=512, help="B; a worker's update is B/N (default: %(default)s)")
    p.add_argument("--rates", choices=("lr_search", "fixed"), default="lr_search",
                   help="each family's rate from the lr_search stage, or --learning-rate for all (default: %(default)s)")
    p.add_argument("--learning-rate", type=float, default=0.05,
                   help="the rate at B with --rates fixed, and of the standalone runs (default: %(default)s)")
    p.add_argument("--schedule", choices=("default", "constant"), default="default",
                   help="the job spec's default schedule and warm-up, or a constant rate without warm-up "
                   "(default: %(default)s)")
    p.add_argument("--target-loss", type=float, default=1.0, help="loss for time-to-target (default: %(default)s)")
    p.add_argument("--slow-share", type=float, default=0.4, help="the slow device's CPU quota (default: %(default)s)")
    p.add_argument("--medium-share", type=float, default=0.6,
                   help="the medium device's CPU quota, with --workers 3 (default: %(default)s)")
    p.add_argument("--max-staleness", default="auto",
                   help="bounded mode's s, or auto: below the async runs' largest staleness (default: %(default)s)")
    p.add_argument("--standalone-steps", type=int, default=40, help="steps of each standalone run (default: %(default)s)")
    p.add_argument("--model", default='{"name": "small_cnn", "kwargs": {"filters": [64, 128]}}',
                   help="the job spec's model, as JSON (default: the demo's, %(default)s)")
    p.add_argument("--async-momentum", type=momentum_arg, default=TrainingSpec.model_fields["async_momentum"].default,
                   help="training.async_momentum: a number, or auto, the job spec's default: 0.9 less the momentum "
                   "N workers' asynchrony adds, 1 - 1/N (default: %(default)s)")
    p.add_argument("--combiner", default=TrainingSpec.model_fields["combiner"].default,
                   help="the parameter server's combiner (default: the job spec's, %(default)s)")
    p.add_argument("--combiner-options", type=json.loads, default={},
                   help='training.combiner_options as JSON, e.g. \'{"expected_staleness": 0}\' (default: none)')
    p.add_argument("--only", default="", help="comma-separated configurations to run (default: all)")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, default=None, help="train every configuration with seeds 1..N (default: 3)")
    seeds.add_argument("--seed-list", default=None, help="the seeds instead, comma-separated, e.g. 1,2,5")
    p.add_argument("--keep", default=None, help="keep the work folder here")
    args = p.parse_args(argv)
    try:
        args.seed_list = seed_list(args.seeds, args.seed_list)
    except ValueError as e:
        p.error(str(e))
    only = [c for c in args.only.split(",") if c] or list(CONFIGURATIONS)
    unknown = sorted(set(only) - set(CONFIGURATIONS))
    if unknown:
        p.error(f"--only: unknown configurations {unknown}; choose from {', '.join(CONFIGURATIONS)}")
    args.only = [c for c in CONFIGURATIONS if c in only]  # the order above: async before bounded
    if args.max_staleness != "auto":
        try:
            args.max_staleness = int(args.max_staleness)
        except ValueError:
            p.error(f"--max-staleness {args.max_staleness!r}: an integer >= 0, or auto")
        if args.max_staleness < 0:
            p.error("--max-staleness: an integer >= 0, or auto")
    elif "ps_bounded" in args.only and "ps_async" not in args.only:
        p.error("--max-staleness auto takes s from the ps_async runs: add ps_async to --only, or give a number")
    for name in ("slow_share", "medium_share"):
        if not 0 < getattr(args, name) <= 1:
            p.error(f"--{name.replace('_', '-')}: a CPU quota in (0, 1]")
    return args


def device_profiles(args) -> list[Profile]:
    """The workers' devices, fastest first (rank or worker 0 is the fast one)."""
    fast, slow = Profile("fast", (1,), 1.0), Profile("slow", (0,), args.slow_share)
    return [fast, slow] if args.workers == 2 else [fast, Profile("medium", (0,), args.medium_share), slow]


def schedule(args) -> dict:
    """The spec's schedule fields: none (the job spec's defaults) or a constant rate."""
    return {} if args.schedule == "default" else {"warmup_epochs": 0, "lr_schedule": "constant"}


def spec_doc(run: Path, args, seed: int, rate, **training) -> dict:
    """The job spec of one run; ``seed`` is ``training.seed`` (initial weights and row order),
    ``rate`` the learning rate at B (``reference_batch`` is B)."""
    return {
        "model": json.loads(args.model),
        "dataset": {"uri": str(run.parent / "data")},
        "training": {"epochs": args.epochs, "global_batch": args.global_batch, "learning_rate": rate,
                     "reference_batch": args.global_batch, "seed": seed, "checkpoint_every_steps": 100000,
                     # auto's pick compares the strategies at the loss this benchmark judges them by
                     "target_loss": args.target_loss, **schedule(args), **training},
        "artifact_root": str(run.parent),
    }


def write_spec(run: Path, name: str, args, seed: int, rate, **training) -> Path:
    path = run / f"spec-{name}.json"
    path.write_text(json.dumps(spec_doc(run, args, seed, rate, **training)))
    return path


class Bench:
    """The runs of one benchmark: the devices, the rates, and what every launch reported."""

    def __init__(self, work: Path, run: Path, args):
        self.work, self.run, self.args = work, run, args
        self.profiles = device_profiles(args)
        self.b = max(1, args.global_batch // len(self.profiles))  # an update's batch (the chief's)
        self.quota: list[bool] = []  # every launch's quota_enforced
        self.async_seen: list[int] = []  # every async run's max_staleness_seen so far
        self.searches: dict[str, dict] = {}
        if args.rates == "fixed":
            self.rates = {c: args.learning_rate for c in args.only}
        else:
            pool = rates_.write_pool(work / "pool.yaml", self.profiles)
            base = spec_doc(run, args, args.seed_list[0], "auto")
            for family in rates_.families(args.only):
                self.searches[family] = rates_.search(work, run, family, self.profiles, base, pool)
                self.quota.append(bool(self.searches[family].get("quota_enforced")))
                print(f"lr_search {family}: {json.dumps(rates_.summary({family: self.searches[family]})[family])}",
                      flush=True)
            self.rates = rates_.configuration_rates(self.searches, args.global_batch, args.only)

    def out(self, name: str) -> Path:
        out = self.run / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        return out

    def horovod(self, name: str, profiles: list[Profile], batches: list[int] | None, seed: int, rate: float,
                max_steps=None) -> tuple[Path, Path]:
        """Train with the Horovod trainer; ``batches=None`` calibrates and re-balances as a real run."""
        name = f"{name}-seed{seed}"
        out = self.out(name)
        spec = write_spec(self.run, name, self.args, seed, rate)
        extra = ["--out", str(out), "--global-batch", str(sum(batches) if batches else self.args.global_batch)]
        if batches is not None:
            plan = {"global_batch": sum(batches),
                    "ranks": [{"rank": i, "device": p.device, "batch": b} for i, (p, b) in enumerate(zip(profiles, batches, strict=True))]}
            (out / "plan.json").write_text(json.dumps(plan))
            extra += ["--plan", str(out / "plan.json"), "--no-balance"]
        if max_steps:
            extra += ["--max-steps", str(max_steps)]
        cmd = [sys.executable, "-m", "pipelines.train.trainer", "--spec", str(spec), "--run-dir", str(self.run), *extra]
        log = io.StringIO()
        result = launch(cmd, profiles, job=f"bench-{name}", timeout_s=1800, output=log)
        return spec, self.ended(name, result, out, log)

    def parameter_server(self, configuration: str, seed: int, **training) -> tuple[Path, Path]:
        """Train with a chief, a worker per device and one parameter server."""
        name = f"{configuration}-seed{seed}"
        out = self.out(name)
        args = self.args
        spec = write_spec(self.run, name, args, seed, self.rates[configuration], strategy="parameter_server",
                          combiner=args.combiner, combiner_options=args.combiner_options,
                          async_momentum=args.async_momentum, **training)
        ports = free_ports(2 + len(self.profiles))
        cluster = cluster_spec(f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{p}" for p in ports[1:-1]], [f"127.0.0.1:{ports[-1]}"])
        cmd = [sys.executable, "-m", "pipelines.train.ps", "--spec", str(spec), "--run-dir", str(self.run), "--out", str(out)]
        log = io.StringIO()
        result = launch_ps(cmd, cluster, self.profiles, job=f"bench-{name}", timeout_s=1800, output=log)
        return spec, self.ended(name, result, out, log)

    def ended(self, name: str, result, out: Path, log: io.StringIO) -> Path | None:
        """A training's output folder; None when its loss diverged (exit 4: a result of the
        configuration at that rate, recorded as a collapse, not a failure of the benchmark);
        any other failure stops the benchmark."""
        if result.returncode == EXIT_DIVERGED:
            print(f"{name}: the loss diverged (recorded as a collapse)", flush=True)
            return None
        if result.returncode != 0:
            raise SystemExit(f"{name} failed: {result.message}\n{log.getvalue()[-3000:]}")
        self.quota.append(result.quota_enforced)
        return out

    def num_classes(self) -> int:
        return int(json.loads((self.run / "preload" / "result.json").read_text())["num_classes"])

    def figures(self, out: Path, evaluate: bool = True) -> dict:
        """Steady throughput, time to the target loss and held-out accuracy of one trained configuration."""
        summary = json.loads((out / "summary.json").read_text())
        history = summary["history"]
        steady = history[1:] or history
        samples = sum(sum(h["samples"]) for h in steady)
        seconds = sum(h["seconds"] for h in steady)
        elapsed, to_target = 0.0, None
        for h in history:
            elapsed += h["seconds"]
            if h["loss"] <= self.args.target_loss:
                to_target = round(elapsed, 2)
                break
        row = {"samples_per_sec": round(samples / max(seconds, 1e-9), 1), "seconds_to_target_loss": to_target,
               "final_loss": round(summary["final_loss"], 4), "train_seconds": round(summary["train_seconds"], 1)}
        if evaluate:
            pre = json.loads((self.run / "preload" / "result.json").read_text())
            acc = holdout(out / "saved_model", pre["holdout_shards"], pre["feature_shape"], pre["num_classes"])["accuracy"]
            row["holdout_accuracy"] = round(acc, 4)
            row["samples"] = int(sum(sum(h["samples"]) for h in history))
        if "parameter_server" in summary:
            ps = summary["parameter_server"]
            row.update(updates=[w["updates"] for w in ps["workers"]], dropped=ps["dropped_updates"],
                       max_staleness_seen=ps["max_staleness_seen"], max_clock_gap=ps.get("max_clock_gap", 0))
            if ps["update_mode"] == "bounded":
                row.update(clock_waits=clock_waits(Path(ps["updates_file"]), ps["max_staleness"]),
                           deferred_updates=ps.get("deferred_updates", 0), clock_wait_s=ps.get("clock_wait_s", 0.0))
        else:
            row["batches"] = history[-1]["batches"]
        return row


def collapsed(name: str, num_classes: int) -> dict:
    """The row of a configuration whose loss diverged: no throughput, loss or time to the target
    (null, left out of the means and counted), and held-out accuracy at chance, 1 / classes (its
    weights are NaN: every prediction is the same class), so that the accuracy gaps count it."""
    row = {"diverged": True, "samples_per_sec": None, "seconds_to_target_loss": None, "final_loss": None,
           "train_seconds": None, "holdout_accuracy": round(1.0 / num_classes, 4), "samples": None}
    if name.startswith("ps_"):
        row.update(updates=None, dropped=None, max_staleness_seen=None, max_clock_gap=None)
        if name == "ps_bounded":
            row.update(clock_waits=None, deferred_updates=None, clock_wait_s=None)
    else:
        row["batches"] = None
    return row


def clock_waits(updates_file: Path, s: int) -> int:
    """Updates of a bounded run that arrived more than ``s`` clocks ahead of the slowest worker
    (``clock_gap_first``, the chief's update log): each waited before computing."""
    if not updates_file.is_file():
        return 0
    rows = (json.loads(line) for line in updates_file.read_text().splitlines() if line.strip())
    return sum(1 for r in rows if int(r.get("clock_gap_first", 0)) > s)


def one_seed(bench: Bench, seed: int, index: int) -> tuple[dict, dict]:
    """Every configuration of ``--only`` and each device alone, trained with ``seed``, in
    ``run_order``: the seed's rows (``per_seed`` of the line) and each run's spec and output."""
    args, profiles, b = bench.args, bench.profiles, bench.b
    B, used = args.global_batch, {}

    def bounded():
        used["s"] = args.max_staleness if isinstance(args.max_staleness, int) else bounded_staleness(bench.async_seen)
        return bench.parameter_server("ps_bounded", seed, update_mode="bounded", max_staleness=used["s"])

    runs = {
        "horovod_equal": lambda: bench.horovod("horovod_equal", profiles, split_proportional(B, [1] * len(profiles)),
                                               seed, bench.rates["horovod_equal"]),
        "horovod_balanced": lambda: bench.horovod("horovod_balanced", profiles, None, seed, bench.rates["horovod_balanced"]),
        "ps_async": lambda: bench.parameter_server("ps_async", seed, update_mode="async"),
        "ps_bounded": bounded,
        "ps_sync": lambda: bench.parameter_server("ps_sync", seed, update_mode="sync"),
        # each device alone at the workers' per-update batch (throughput only: the fixed rate)
        **{p.device: (lambda p=p: bench.horovod(f"{p.device}_alone", [p], [b], seed, args.learning_rate,
                                                max_steps=args.standalone_steps)) for p in profiles},
    }
    devices = [p.device for p in profiles]
    order = run_order([*args.only, *devices], index)
    results, alone, outs = {}, {}, {}
    for name in order:
        spec, out = runs[name]()
        if out is None and name not in devices:  # diverged: a collapse, at chance accuracy
            results[name] = collapsed(name, bench.num_classes())
            print(f"seed {seed} {name}", json.dumps(results[name]), flush=True)
            continue
        if out is None:
            raise SystemExit(f"{name} alone diverged at the fixed --learning-rate {args.learning_rate}: lower it")
        if name in devices:
            alone[name] = bench.figures(out, evaluate=False)["samples_per_sec"]
            print(f"seed {seed} {name}_alone", json.dumps(alone[name]), flush=True)
            continue
        outs[name] = {"spec": spec, "out": out}
        results[name] = bench.figures(out)
        if name == "ps_async" and results[name]["max_staleness_seen"] is not None:
            bench.async_seen.append(results[name]["max_staleness_seen"])
        print(f"seed {seed} {name}", json.dumps(results[name]), flush=True)
    results = {name: results[name] for name in args.only}  # the line's order, not the run's
    alone = {d: alone[d] for d in devices}
    row = {"seed": seed, "order": order, "strategies": results, "standalone_samples_per_sec": alone,
           **seed_figures(results, alone)}
    if "ps_bounded" in results:
        bounded_row = results["ps_bounded"]
        waits = [bounded_row.get("clock_waits"), bounded_row.get("deferred_updates")]
        row.update(max_staleness=used["s"], bounded_waited=None if None in waits else sum(waits) > 0)
    return row, outs


def first_seed_pick(bench: Bench, row: dict, outs: dict) -> dict | None:
    """``strategy: auto``'s pick learned from the first seed's runs (bench/strategies_auto.py), or
    None when ``--only`` left out Horovod balanced or the parameter server's default mode."""
    names = {"horovod": HOROVOD, "parameter_server": ps_default()}
    if not all(n in outs for n in names.values()):
        return None
    pre = json.loads((bench.run / "preload" / "result.json").read_text())
    runs = {s: {**outs[n], "samples_per_sec": row["strategies"][n]["samples_per_sec"]} for s, n in names.items()}
    pool = rates_.write_pool(bench.work / "pool.yaml", bench.profiles)
    return predict_pick(bench.work, pool, runs, row["standalone_samples_per_sec"], int(pre["rows_train"]), row["seed"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-strategies-")).resolve()
    run = prepare(work, args.rows, seed=0) if not (work / "run" / "preload" / "result.json").is_file() else work / "run"
    bench = Bench(work, run, args)
    per_seed, auto = [], None
    for i, seed in enumerate(args.seed_list):
        row, outs = one_seed(bench, seed, i)
        per_seed.append(row)
        if i == 0:
            auto = first_seed_pick(bench, row, outs)
            print(f"auto, learned from seed {seed}: {json.dumps(auto)}", flush=True)
    line = aggregate(per_seed)
    agreement = pick_agreement(auto and auto["pick"], per_seed[1:], [HOROVOD, ps_default()])
    regret = pick_regret(auto and auto["pick"], per_seed[1:], [HOROVOD, ps_default()])
    defaults = TrainingSpec.model_fields
    sched = {"lr_schedule": defaults["lr_schedule"].default, "warmup_epochs": defaults["warmup_epochs"].default,
             **schedule(args)}
    bounded = "ps_bounded" in args.only
    line.update(
        workers=args.workers,
        devices=[{"device": p.device, "cpus": list(p.cpus), "cpu_share": p.cpu_share} for p in bench.profiles],
        update_batch=bench.b, rates=bench.rates, rates_from=args.rates,
        lr_search=rates_.summary(bench.searches) if bench.searches else None, **sched,
        max_staleness=([p["max_staleness"] for p in per_seed] if args.max_staleness == "auto" else args.max_staleness)
        if bounded else None,
        max_staleness_rule="auto: max(1, floor(median of the async runs' max_staleness_seen so far) - 1)"
        if args.max_staleness == "auto" else "fixed",
        bounded_waited=[p["bounded_waited"] for p in per_seed] if bounded else None,
        auto_pick=auto and auto["pick"], auto_strategy=auto and auto["strategy"], auto_reason=auto and auto["reason"],
        auto_predicted=auto and auto["strategies"], auto_learned_from=args.seed_list[0] if auto else None,
        auto_curves_recorded=auto and auto["curves_recorded"],
        auto_agreement=agreement["per_seed"], auto_picks_faster_to_accuracy=agreement["all"],
        auto_pick_regret=regret["regret"], auto_later_seconds_to_target=regret["means"],
        quota_enforced=all(bench.quota), combiner=args.combiner, combiner_options=args.combiner_options,
        async_momentum=args.async_momentum,
        async_momentum_applied=server_momentum(TrainingSpec(update_mode="async", async_momentum=args.async_momentum),
                                               args.workers),
        learning_rate=args.learning_rate if args.rates == "fixed" else None, rows=args.rows, epochs=args.epochs,
        global_batch=args.global_batch, slow_share=args.slow_share,
        medium_share=args.medium_share if args.workers == 3 else None, target_loss=args.target_loss, per_seed=per_seed)
    line["goals"] = goals(line)
    line["goals_missed"] = [k for k, g in line["goals"].items() if not g["met"]]
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(table(line), flush=True)
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
