"""Benchmark: the lr_search stage's rate against a fine grid search of the same training, scored on
held-out rows, on combinations the rule was never tuned on.

Run in the trainer environment::

    .venv-trainer/bin/python bench/lr_search.py [--reporting all] [--tuning all] [--seeds 1,2,3] \
        [--rows-per-day 8000] [--epochs 2] [--out DIR]

Combinations are model x global batch x optimizer, in two disjoint sets:

* TUNING: tiny_mlp and small_cnn, B = 64 and 256, SGD and Adam -- the 8 combinations the rule's
  constants (confirmation length, candidate factors) were tuned on -- and, since 2026-11-29, three
  at B = 512 (tiny_mlp with SGD and Adam, small_cnn with Adam), so that a rule change for the
  large batch, where the reporting set missed, can be argued without the reporting set; since
  2026-12-03 a second combination of SGD at B = 512, pair_cnn (conv_net with 8 and 16 filters and a
  dense layer of 64), since both reporting misses at B = 512 are SGD's.  A rule change may only be
  justified by these.
* REPORTING: combinations the rule has never seen (other models from pipelines/models/examples.py
  with other widths and filters, batches 128 and 512).  The JSON line's headline figures come
  from these alone; the tuning set's figures are under ``"tuning"``.

For each combination, on a heterogeneous two-rank plan of the local pool (the fast device and the
slow one, 40% of a core, the batch split 70/30), every run going through the real stages:

1. the real lr_search stage (range test, analysis, confirmation runs), timed end to end, with the
   first seed;
2. a coarse pass, one seed: the optimizer's 7 half-decade points (SGD 1e-3 .. 1, Adam 1e-4 .. 0.1),
   extended by up to 2 points past an edge that comes out best;
3. the fine grid: the coarse best x 10^{-0.5, -0.25, 0, 0.25, 0.5} (quarter-decade), every point
   on every seed (a coarse run of the same rate and seed is reused);
4. the chosen rate on every seed, and the rates of fastai's valley and Lightning's rule on the
   first ``--reference-seeds`` seeds (default 1).

The seed sets the initial weights and each epoch's order of rows.  Every run is scored on the
held-out rows (mean cross-entropy, accuracy) and on its final training loss (mean of the last fifth
of windows); scoring and collapse are in bench/lr_search_score.py.  The grid's best point is also
scored with one seed held out (picked on the other seeds' means, scored on the seed left out), since
the lowest of several noisy means is biased low; both figures are in the line.  Prints a table per set, writes
every run to ``--out``/runs.json and ends with one JSON line (keys in bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lr_search_runs import MODELS, ROOT, Bench  # noqa: E402
from lr_search_score import (  # noqa: E402
    COARSE,
    COARSE_STEP,
    FINE_STEPS,
    GOALS,
    MAX_EXTEND,
    MIN_BEST_LOSS,
    coarse_best,
    combo_scores,
    fine_rates,
    misses,
    rate_key,
    seed_held_out_view,
    summarise,
)

POOL = ROOT / "examples" / "pool-local.yaml"
TUNING = [(m, b, o) for m in ("tiny_mlp", "small_cnn") for b in (64, 256) for o in ("sgd", "adam")] + [
    ("tiny_mlp", 512, "sgd"), ("tiny_mlp", 512, "adam"), ("small_cnn", 512, "adam"), ("pair_cnn", 512, "sgd")]
REPORTING = [("wide_mlp", 128, "sgd"), ("narrow_cnn", 128, "adam"), ("deep_mlp", 512, "adam"),
             ("conv_net", 512, "sgd"), ("tiny_mlp", 128, "adam"), ("small_cnn", 512, "sgd")]
REFERENCES = ("fastai_valley", "lightning")
MAX_LR = 9.99  # the spec's learning_rate is below 10


def fail(message: str) -> None:
    """A bad option: one ERROR line, exit 2."""
    print(f"ERROR: {message}", file=sys.stderr)
    raise SystemExit(2)


def one_combo(bench: Bench, combo: tuple, seeds: list[int], group: str, coarse_rates: list[float] | None = None,
              fine_steps: tuple[float, ...] = FINE_STEPS, reference_seeds: int = 1) -> dict:
    """Search, coarse pass (``coarse_rates``: these rates, not extended; default the optimizer's 7
    points, extended past a best edge), fine grid, chosen rate (every seed) and references (the first
    ``reference_seeds`` seeds) of one combination."""
    model, batch, optimizer = combo
    tag = f"{model}-{batch}-{optimizer}"
    found, search_s = bench.search(tag, combo, seeds[0])
    runs: dict[tuple[float, int], dict] = {}

    def train(lr: float, seed: int, what: str) -> dict:
        key = (rate_key(lr), seed)
        if key not in runs:
            runs[key] = {**bench.train(f"{tag}-{what}", combo, lr, seed), "what": what}
        return runs[key]

    coarse = [train(lr, seeds[0], "coarse") for lr in coarse_rates or COARSE[optimizer]]
    for _ in range(0 if coarse_rates else MAX_EXTEND):  # the best at an edge: the grid's range was too narrow, extend it
        best, edge = coarse_best(coarse, bench.num_classes)
        lr = rate_key(best * 10 ** (edge * COARSE_STEP))
        if not edge or lr > MAX_LR:
            break
        coarse.append(train(lr, seeds[0], "coarse"))
    center, _ = coarse_best(coarse, bench.num_classes)
    fine = [train(lr, s, "fine") for lr in fine_rates(center, fine_steps) if lr <= MAX_LR for s in seeds]
    chosen = [train(found["learning_rate"], s, "chosen") for s in seeds]
    refs = {n: [train(lr, s, n) for s in seeds[:reference_seeds]] for n, lr in (found.get("references") or {}).items()
            if n in REFERENCES and lr}
    row = {
        "combo": tag, "set": group, "chosen_lr": found["learning_rate"], "reason": found["reason"],
        **{f"{n}_lr": (found.get("references") or {}).get(n) for n in REFERENCES},
        "coarse_center_lr": center, "search_s": search_s,
        "fine_grid_s": sum(r["seconds"] for r in fine),
        "coarse_s": sum(r["seconds"] for r in coarse),
        **combo_scores(fine, chosen, refs, bench.num_classes),
        "candidates": found.get("candidates"), "sweep_steps": found.get("steps"),
        "runs": sorted(runs.values(), key=lambda r: (r["lr"], r["seed"])),
    }
    row["cost_vs_grid"] = row["search_s"] / row["fine_grid_s"]
    print(line_of(row), flush=True)
    return row


def fmt(v, spec: str = ".4f") -> str:
    return "-" if v is None else ("inf" if isinstance(v, float) and math.isinf(v) else format(v, spec))


def line_of(r: dict) -> str:
    return (f"[{r['set']}] {r['combo']:22s} chosen {r['chosen_lr']:.3g} acc {fmt(r['holdout_accuracy'])} "
            f"loss {fmt(r['holdout_loss'])}; best fine point {r['best_accuracy_lr']:.3g} acc "
            f"{fmt(r['best_holdout_accuracy'])}, {r['best_loss_lr']:.3g} loss {fmt(r['best_holdout_loss'])}; "
            f"gap {fmt(r['holdout_accuracy_gap'])} ratio {fmt(r['holdout_loss_ratio'], '.3f')} (against the best "
            f"picked on the other seeds: gap {fmt(r['holdout_accuracy_gap_seed_held_out'])} ratio "
            f"{fmt(r['holdout_loss_ratio_seed_held_out'], '.3f')}); valley gap "
            f"{fmt(r.get('fastai_valley_holdout_accuracy_gap'))} lightning gap "
            f"{fmt(r.get('lightning_holdout_accuracy_gap'))}; collapses {r['collapses']}; search "
            f"{r['search_s']:.1f}s / fine grid {r['fine_grid_s']:.0f}s = {r['cost_vs_grid']:.3f}")


def table(rows: list[dict], title: str) -> str:
    """A markdown table of one set's combinations (as in bench/README.md)."""
    out = [f"\n{title}", "| model, B, optimizer | chosen rate | best fine rate (acc / loss) | held-out accuracy chosen "
           "/ best | gap | held-out loss chosen / best | ratio | gap / ratio, best picked on the other seeds | train loss "
           "ratio | valley gap | Lightning gap | collapses | lr_search / fine grid time |", "| --- " * 13 + "|"]
    for r in rows:
        m, b, o = r["combo"].rsplit("-", 2)
        out.append(
            f"| {m}, {b}, {o} | {r['chosen_lr']:.3g} | {r['best_accuracy_lr']:.3g} / {r['best_loss_lr']:.3g} | "
            f"{fmt(r['holdout_accuracy'])} / {fmt(r['best_holdout_accuracy'])} | {fmt(r['holdout_accuracy_gap'])} | "
            f"{fmt(r['holdout_loss'])} / {fmt(r['best_holdout_loss'])} | {fmt(r['holdout_loss_ratio'], '.3f')} | "
            f"{fmt(r['holdout_accuracy_gap_seed_held_out'])} / {fmt(r['holdout_loss_ratio_seed_held_out'], '.3f')} | "
            f"{fmt(r['train_loss_ratio'], '.3f')} | {fmt(r.get('fastai_valley_holdout_accuracy_gap'))} | "
            f"{fmt(r.get('lightning_holdout_accuracy_gap'))} | {r['collapses']} of {r['chosen_seeds']} | "
            f"{r['search_s']:.1f} s / {r['fine_grid_s']:.0f} s = {r['cost_vs_grid']:.3f} |")
    return "\n".join(out)


def judged(summary: dict) -> dict:
    """A set's summary with the goals it misses, against the in-sample best (``goals_missed``) and
    the seed-held-out one (``goals_missed_seed_held_out``); None for an empty set.  With no loss
    ratio to judge, the ratio's goals are neither missed nor met."""
    for key, view in (("goals_missed", summary), ("goals_missed_seed_held_out", seed_held_out_view(summary))):
        missed = misses(view, GOALS) if summary["combinations"] else None
        if missed and summary.get("holdout_loss_ratio_combos") == 0:
            missed = [k for k in missed if not k.startswith("holdout_loss_ratio")]
        summary[key] = missed
    return summary


def parse_combos(text: str, default: list[tuple], option: str) -> list[tuple]:
    """``all``, ``none``, a count (the first N of the default list) or model-batch-optimizer,...."""
    if text == "all":
        return list(default)
    if text == "none":
        return []
    if text.isdigit():
        if not 0 <= int(text) <= len(default):
            fail(f"{option} {text}: there are {len(default)} combinations in that set")
        return list(default[:int(text)])
    combos = []
    for part in text.split(","):
        try:
            model, batch, optimizer = part.rsplit("-", 2)
            combo = (model, int(batch), optimizer)
        except ValueError:
            fail(f"{option}: {part!r} is not model-batch-optimizer (e.g. tiny_mlp-64-sgd)")
        if model not in MODELS or optimizer not in COARSE or combo[1] < 2:
            fail(f"{option}: {part!r}: model one of {sorted(MODELS)}, optimizer sgd or adam, batch >= 2")
        combos.append(combo)
    return combos


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reporting", default="all", help="reporting combinations: all, N (the first N), none, or "
                   "model-batch-optimizer,... (default: %(default)s, " + str(len(REPORTING)) + ")")
    p.add_argument("--tuning", default="all", help="tuning combinations, as --reporting (default: all " + str(len(TUNING)) + ")")
    p.add_argument("--seeds", default="1,2,3", help="training seeds, at least 2 (default: %(default)s)")
    p.add_argument("--reference-seeds", type=int, default=1,
                   help="train the references' rates on the first N seeds (default: %(default)s)")
    p.add_argument("--rows-per-day", type=int, default=8000, help="sample rows per day, 3 days (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--data-seed", type=int, default=0, help="the sample data's and held-out split's seed")
    p.add_argument("--coarse", default=None, help="comma-separated rates of the coarse pass, for every "
                   "combination, not extended (default: the optimizer's 7 half-decade points)")
    p.add_argument("--fine-steps", default=",".join(f"{s:g}" for s in FINE_STEPS),
                   help="the fine grid, in decades around the coarse best (default: %(default)s)")
    p.add_argument("--pool", default=str(POOL), help="the pool file (default: %(default)s)")
    p.add_argument("--out", default=None, help="folder for runs.json (default: a temporary one, kept)")
    args = p.parse_args()
    reporting = parse_combos(args.reporting, REPORTING, "--reporting")
    tuning = parse_combos(args.tuning, TUNING, "--tuning")
    if set(reporting) & set(TUNING):
        fail(f"--reporting: {sorted(set(reporting) & set(TUNING))} are tuning combinations; report on others")
    if not reporting and not tuning:
        fail("nothing to run: --reporting and --tuning are both none")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        fail(f"--seeds {args.seeds!r}: comma-separated integers")
    if len(set(seeds)) < 2:
        fail(f"--seeds {args.seeds!r}: at least 2 different seeds")
    try:
        coarse = [float(r) for r in args.coarse.split(",")] if args.coarse else None
        fine_steps = tuple(float(s) for s in args.fine_steps.split(","))
    except ValueError:
        fail("--coarse and --fine-steps: comma-separated numbers")
    if coarse and not all(0 < r <= MAX_LR for r in coarse):
        fail(f"--coarse: rates in (0, {MAX_LR}]")
    if not 1 <= args.reference_seeds <= len(seeds):
        fail(f"--reference-seeds {args.reference_seeds}: 1 to {len(seeds)}")
    if args.epochs < 1 or args.rows_per_day < 100:
        fail("--epochs must be at least 1 and --rows-per-day at least 100")
    work = Path(tempfile.mkdtemp(prefix="bench-lr-"))
    out = Path(args.out) if args.out else work
    try:
        bench = Bench(work, args.rows_per_day, 3, args.data_seed, args.epochs, str(Path(args.pool).resolve()))
        print(f"{bench.preload['rows_train']} training rows, {bench.preload.get('rows_holdout')} held out; "
              f"{len(reporting)} reporting and {len(tuning)} tuning combinations, seeds {seeds}, "
              f"{args.epochs} epochs each", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        rows = []
        for group, combo in [("reporting", c) for c in reporting] + [("tuning", c) for c in tuning]:
            rows.append(one_combo(bench, combo, seeds, group, coarse, fine_steps, args.reference_seeds))
            (out / "runs.json").write_text(json.dumps(rows, indent=1, default=str))  # after each: a crash keeps them
    finally:
        for child in work.iterdir() if work.exists() else []:
            if child.name != "runs.json":
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
        if out != work:
            shutil.rmtree(work, ignore_errors=True)
    rep, tun = [r for r in rows if r["set"] == "reporting"], [r for r in rows if r["set"] == "tuning"]
    if rep:
        print(table(rep, "REPORTING set (the headline figures)"))
    if tun:
        print(table(tun, "TUNING set (the rule may be tuned on these; not the headline)"))
    summary, tuning_summary = judged(summarise(rep, REFERENCES)), judged(summarise(tun, REFERENCES))
    summary.update(tuning=tuning_summary, seeds=seeds, reference_seeds=seeds[:args.reference_seeds], epochs=args.epochs, rows_train=bench.preload["rows_train"],
                   rows_holdout=bench.preload.get("rows_holdout"), min_best_loss=MIN_BEST_LOSS,
                   reporting_combos=[r["combo"] for r in rep], tuning_combos=[r["combo"] for r in tun])
    print(f"REPORTING: {json.dumps({k: v for k, v in summary.items() if k != 'tuning'}, sort_keys=True)}")
    print(f"TUNING: {json.dumps(tuning_summary, sort_keys=True)}")
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
