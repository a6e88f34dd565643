"""bench/strategies.py over several seeds: the seeds, the order of the runs, the figures' mean
and sample standard deviation over the seeds, the bounded run's s, the check of ``strategy:
auto``'s pick against the seeds' runs, and the goals.

Pure functions of the per-seed figures (no training, no TensorFlow), so that tests can check them
on made-up numbers.  A seed's figures are those of one training per configuration, as
``bench/strategies.py`` measured them before it ran several seeds; ``aggregate`` gives the JSON
line's figures: every figure's mean over the seeds under its old key, its sample standard
deviation under ``<key>_sd`` (null with fewer than two values) and its values seed by seed under
``<key>_per_seed``.  A value that is null for some seeds (a target loss never reached) is averaged
over the seeds that have one, and ``seconds_to_target_loss_reached`` counts them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean, median, stdev

# a configuration's figures that get a mean and a standard deviation, and their rounding
FIGURES = {"samples_per_sec": 1, "seconds_to_target_loss": 2, "holdout_accuracy": 4, "final_loss": 4,
           "train_seconds": 1, "dropped": 2, "max_staleness_seen": 2, "max_clock_gap": 2, "clock_waits": 2,
           "deferred_updates": 2, "clock_wait_s": 3}
# figures that are one number per worker or rank: averaged element by element
VECTORS = {"batches": 1, "updates": 1}
# the top-level figures, each computed within a seed (paired: runs of the same seed), then averaged
PAIRED = ("async_vs_standalone_sum", "async_accuracy_gap", "bounded_accuracy_gap")
# the acceptance goals: (figure, comparison, bound); the first three on the mean over the seeds
GOALS = (("async_accuracy_gap", "<=", 0.01), ("bounded_accuracy_gap", "<=", 0.01),
         ("async_vs_standalone_sum", ">=", 0.90), ("auto_picks_faster_to_accuracy", "is", True))


def seed_list(seeds: int | None, listed: str | None) -> list[int]:
    """The seeds to run: ``listed`` ("1,2,5") when given, else 1..``seeds``.  ValueError when
    there is none, one is not an integer, or one repeats."""
    if listed is not None:
        try:
            out = [int(s) for s in listed.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--seed-list {listed!r}: comma-separated integers, e.g. 1,2,3") from None
        if len(set(out)) != len(out):
            raise ValueError(f"--seed-list {listed!r}: a seed repeats")
    else:
        out = list(range(1, (seeds if seeds is not None else 3) + 1))
    if not out:
        raise ValueError("at least one seed (--seeds N with N >= 1, or --seed-list)")
    return out


def run_order(names: Sequence[str], index: int) -> list[str]:
    """The order of the runs of the ``index``-th seed: ``names`` as given for even indices,
    reversed for odd ones, so that over two seeds every run sits as early as every other and a
    drift of the host's speed does not favour the configurations run first."""
    return list(names) if index % 2 == 0 else list(reversed(names))


def mean_sd(values: Sequence[float | None], digits: int) -> tuple[float | None, float | None, int]:
    """Mean and sample standard deviation (n - 1) of the values that are not None, rounded to
    ``digits``, and how many there were.  No values: (None, None, 0); one: (it, None, 1)."""
    known = [float(v) for v in values if v is not None]
    if any(not math.isfinite(v) for v in known):
        raise ValueError(f"not a finite number among {list(values)}")
    mean = round(fmean(known), digits) if known else None
    sd = round(stdev(known), digits) if len(known) >= 2 else None
    return mean, sd, len(known)


def summary(values: Sequence[float | None], digits: int, key: str) -> dict:
    """``{key: mean, key_sd: sd, key_per_seed: values}``."""
    mean, sd, _ = mean_sd(values, digits)
    return {key: mean, f"{key}_sd": sd, f"{key}_per_seed": list(values)}


def elementwise_mean(vectors: Sequence[Sequence[float]], digits: int) -> list[float]:
    """The mean of every position of equally long vectors (a rank's batch, a worker's updates)."""
    if len({len(v) for v in vectors}) != 1:
        raise ValueError(f"vectors of different lengths: {list(vectors)}")
    return [round(fmean(column), digits) for column in zip(*vectors, strict=True)]


def configuration(rows: Sequence[dict]) -> dict:
    """One configuration's figures over the seeds, from its rows seed by seed."""
    out: dict = {}
    for key, digits in FIGURES.items():
        if key in rows[0]:
            out.update(summary([r[key] for r in rows], digits, key))
    if "seconds_to_target_loss" in rows[0]:
        out["seconds_to_target_loss_reached"] = sum(r["seconds_to_target_loss"] is not None for r in rows)
    if "samples" in rows[0]:
        samples = [r["samples"] for r in rows if r["samples"] is not None]  # the same epochs: the same samples
        out["samples"] = (samples[0] if len(set(samples)) == 1 else round(fmean(samples), 1)) if samples else None
    for key, digits in VECTORS.items():
        if key in rows[0]:
            known = [r[key] for r in rows if r[key] is not None]  # a diverged run has none
            out[key] = elementwise_mean(known, digits) if known else None
            out[f"{key}_per_seed"] = [r[key] for r in rows]
    # runs whose loss diverged (bench/strategies.py's collapsed(): chance accuracy, no figures)
    out["diverged"] = sum(bool(r.get("diverged")) for r in rows)
    return out


def seed_figures(results: dict[str, dict], alone: dict[str, float]) -> dict:
    """One seed's top-level figures, from its runs (paired: every figure compares runs of the
    same seed).  ``async_vs_standalone_sum``: async throughput over the sum of the devices'
    standalone throughputs; ``<mode>_accuracy_gap``: Horovod balanced's held-out accuracy minus
    the mode's.  A figure whose runs are missing (``--only``) is left out."""
    out: dict = {}
    if "ps_async" in results and alone:  # null when async diverged (no throughput to compare)
        rate = results["ps_async"]["samples_per_sec"]
        out["async_vs_standalone_sum"] = None if rate is None else round(rate / sum(alone.values()), 4)
    if "horovod_balanced" in results:
        base = results["horovod_balanced"]["holdout_accuracy"]
        for mode in ("async", "bounded"):
            if f"ps_{mode}" in results:
                out[f"{mode}_accuracy_gap"] = round(base - results[f"ps_{mode}"]["holdout_accuracy"], 4)
    return out


def aggregate(per_seed: Sequence[dict]) -> dict:
    """The JSON line's figures over the seeds.  ``per_seed``: one dict a seed, with ``seed``,
    ``strategies`` (configuration: row), ``standalone_samples_per_sec`` (device: samples/s) and
    its :func:`seed_figures`; every seed ran the same configurations."""
    if not per_seed:
        raise ValueError("no seeds to aggregate")
    names = list(per_seed[0]["strategies"])
    if any(list(p["strategies"]) != names for p in per_seed):
        raise ValueError("every seed must run the same configurations")
    line: dict = {"strategies": {name: configuration([p["strategies"][name] for p in per_seed]) for name in names}}
    devices = list(per_seed[0]["standalone_samples_per_sec"])
    alone = {d: mean_sd([p["standalone_samples_per_sec"][d] for p in per_seed], 1) for d in devices}
    line["standalone_samples_per_sec"] = {d: m for d, (m, _, _) in alone.items()}
    line["standalone_samples_per_sec_sd"] = {d: s for d, (_, s, _) in alone.items()}
    line["standalone_samples_per_sec_per_seed"] = {d: [p["standalone_samples_per_sec"][d] for p in per_seed]
                                                   for d in devices}
    for key in PAIRED:
        if key in per_seed[0]:
            line.update(summary([p[key] for p in per_seed], 4, key))
    line["seeds"] = [p["seed"] for p in per_seed]
    return line


def bounded_staleness(seen: Sequence[int]) -> int:
    """The bounded run's s from the largest staleness each async run saw so far (``seen``, one per
    async run): one below their median, at least 1, so that the bound is tighter than what async
    reaches unbounded (whether it held a worker back is measured: ``clock_waits``).  The median
    rather than the last run's value, so that one seed's unusually calm async run does not loosen
    every later bound."""
    if not seen:
        raise ValueError("no async run yet to take the staleness from: run ps_async first, or give --max-staleness N")
    return max(1, math.floor(median(seen)) - 1)


def first_to_target(results: dict[str, dict], names: Sequence[str]) -> str | None:
    """Which of the configurations ``names`` reached the target loss first in one seed's
    ``results`` (the least ``seconds_to_target_loss``; one that never reached it loses to one that
    did); None when none of them reached it."""
    reached = [(results[n]["seconds_to_target_loss"], n) for n in names
               if results.get(n, {}).get("seconds_to_target_loss") is not None]
    return min(reached)[1] if reached else None


def pick_agreement(pick: str | None, per_seed: Sequence[dict], names: Sequence[str]) -> dict:
    """``strategy: auto``'s ``pick`` (a configuration of ``names``, predicted from the first seed)
    against the configuration that reached the target loss first in each later seed (``per_seed``:
    those seeds, each with ``seed`` and ``strategies``).  ``agrees`` per seed: True or False, None
    when no configuration reached the target (nothing to compare).  ``all``: True when every later
    seed agrees, False when one disagrees, None otherwise (no later seed, no pick, or an
    undecided seed and no disagreement)."""
    rows = []
    for p in per_seed:
        actual = first_to_target(p["strategies"], names)
        agrees = None if actual is None or pick is None else actual == pick
        rows.append({"seed": p["seed"], "first_to_target": actual, "agrees": agrees})
    verdicts = [r["agrees"] for r in rows]
    if not verdicts or pick is None:
        verdict = None
    elif False in verdicts:
        verdict = False
    else:
        verdict = None if None in verdicts else True
    return {"per_seed": rows, "all": verdict}


def pick_regret(pick: str | None, per_seed: Sequence[dict], names: Sequence[str]) -> dict:
    """How much later ``pick`` reached the target loss than the configuration that reached it
    soonest on average over the later seeds (``per_seed``, as in :func:`pick_agreement`).

    ``auto_picks_faster_to_accuracy`` asks the pick to win every later seed, which no pick can
    promise when two configurations are closer than the seeds' spread (seeds 14-16 in
    bench/README.md: each won one later seed).  ``regret`` (mean seconds of the pick over the
    smallest mean, minus 1; 0 when the pick is the faster on average) says how much such a miss
    costs.  ``means``: each configuration's mean seconds to the target over the later seeds, None
    when it missed the target in one of them (it then cannot be the faster on average).
    ``regret`` is None with no pick, no later seed, or a pick that missed the target in a later
    seed."""
    means = {}
    for name in names:
        times = [p["strategies"].get(name, {}).get("seconds_to_target_loss") for p in per_seed]
        means[name] = round(fmean(times), 2) if times and None not in times else None
    if pick is None or means.get(pick) is None:
        return {"means": means, "regret": None}
    best = min(m for m in means.values() if m is not None)
    return {"means": means, "regret": round(means[pick] / best - 1, 4)}


def goals(line: dict) -> dict:
    """Each goal of :data:`GOALS` with its value and whether the line meets it (a missing or null
    value does not)."""
    out = {}
    for key, op, bound in GOALS:
        value = line.get(key)
        if value is None:
            met = False
        elif op == "<=":
            met = value <= bound
        elif op == ">=":
            met = value >= bound
        else:
            met = value is bound
        out[key] = {"value": value, "goal": f"{op} {bound}".replace("is True", "true"), "met": met}
    return out


def pm(mean: float | None, sd: float | None, digits: int) -> str:
    """``mean ± sd`` for a table ("never" for no mean, the mean alone for no sd)."""
    if mean is None:
        return "never"
    return f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def table(line: dict) -> str:
    """The configurations' mean ± sd as a Markdown table, then the goals (printed before the JSON
    line; bench/README.md holds them)."""
    rows = ["| configuration | rate at B | samples/s | s to target loss (seeds reaching it) | held-out accuracy | "
            "final loss |", "| --- | --- | --- | --- | --- | --- |"]
    n = len(line["seeds"])
    rates = line.get("rates") or {}
    for name, r in line["strategies"].items():
        target = pm(r["seconds_to_target_loss"], r["seconds_to_target_loss_sd"], 1)
        rate = f"{rates[name]:.4g}" if rates.get(name) is not None else ""
        rows.append(f"| {name} | {rate} | {pm(r['samples_per_sec'], r['samples_per_sec_sd'], 0)} | "
                    f"{target} ({r['seconds_to_target_loss_reached']}/{n}) | "
                    f"{pm(r['holdout_accuracy'], r['holdout_accuracy_sd'], 3)}"
                    f"{f' ({d}/{n} diverged: at chance)' if (d := r.get('diverged')) else ''} | "
                    f"{pm(r['final_loss'], r['final_loss_sd'], 3)} |")
    alone = line.get("standalone_samples_per_sec") or {}
    sds = line.get("standalone_samples_per_sec_sd") or {}
    if alone:
        rows.append("| each device alone | | " + ", ".join(f"{d} {pm(v, sds.get(d), 0)}" for d, v in alone.items())
                    + " | | | |")
    rows += ["", "| goal | mean ± sd | per seed | met |", "| --- | --- | --- | --- |"]
    for key, g in (line.get("goals") or {}).items():
        if isinstance(g["value"], bool) or g["value"] is None:
            value, per = str(g["value"]).lower() if g["value"] is not None else "null", ""
            if key == "auto_picks_faster_to_accuracy":
                per = ", ".join(str(a["agrees"]).lower() if a["agrees"] is not None else "undecided"
                                for a in line.get("auto_agreement") or [])
        else:
            value = pm(g["value"], line.get(f"{key}_sd"), 3)
            per = ", ".join("null" if v is None else f"{v:.3f}" for v in line.get(f"{key}_per_seed") or [])
        rows.append(f"| `{key}` {g['goal']} | {value} | {per} | {'met' if g['met'] else '**missed**'} |")
    if line.get("auto_pick"):
        regret = line.get("auto_pick_regret")
        means = ", ".join(f"{n} {'missed' if m is None else f'{m:.2f} s'}"
                          for n, m in (line.get("auto_later_seconds_to_target") or {}).items())
        rows.append(f"| `auto_pick_regret` (a figure) | {'null' if regret is None else f'{regret:.3f}'} | "
                    f"later seeds' mean: {means} | |")
    return "\n".join(rows)
