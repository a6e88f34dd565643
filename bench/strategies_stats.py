"""bench/strategies.py over several seeds: the seeds, the order of the runs, and the figures'
mean and sample standard deviation over the seeds.

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
from statistics import fmean, stdev

# a configuration's figures that get a mean and a standard deviation, and their rounding
FIGURES = {"samples_per_sec": 1, "seconds_to_target_loss": 2, "holdout_accuracy": 4, "final_loss": 4,
           "train_seconds": 1, "dropped": 2, "max_staleness_seen": 2}
# figures that are one number per worker or rank: averaged element by element
VECTORS = {"batches": 1, "updates": 1}
# the top-level figures, each computed within a seed (paired: runs of the same seed), then averaged
PAIRED = ("async_vs_standalone_sum", "async_accuracy_gap", "bounded_accuracy_gap")


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
        samples = [r["samples"] for r in rows]  # the same epochs: the same samples every seed
        out["samples"] = samples[0] if len(set(samples)) == 1 else round(fmean(samples), 1)
    for key, digits in VECTORS.items():
        if key in rows[0]:
            out[key] = elementwise_mean([r[key] for r in rows], digits)
            out[f"{key}_per_seed"] = [r[key] for r in rows]
    return out


def seed_figures(results: dict[str, dict], alone: dict[str, float]) -> dict:
    """One seed's top-level figures, from its runs (paired: every figure compares runs of the
    same seed).  ``async_vs_standalone_sum``: async throughput over the sum of the devices'
    standalone throughputs; ``<mode>_accuracy_gap``: Horovod balanced's held-out accuracy minus
    the mode's.  A figure whose runs are missing (``--only``) is left out."""
    out: dict = {}
    if "ps_async" in results and alone:
        out["async_vs_standalone_sum"] = round(results["ps_async"]["samples_per_sec"] / sum(alone.values()), 4)
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


def pm(mean: float | None, sd: float | None, digits: int) -> str:
    """``mean ± sd`` for a table ("never" for no mean, the mean alone for no sd)."""
    if mean is None:
        return "never"
    return f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def table(line: dict) -> str:
    """The configurations' mean ± sd as a Markdown table (printed before the JSON line)."""
    rows = ["| configuration | samples/s | s to target loss (seeds reaching it) | held-out accuracy |",
            "| --- | --- | --- | --- |"]
    n = len(line["seeds"])
    for name, r in line["strategies"].items():
        target = pm(r["seconds_to_target_loss"], r["seconds_to_target_loss_sd"], 1)
        rows.append(f"| {name} | {pm(r['samples_per_sec'], r['samples_per_sec_sd'], 0)} | "
                    f"{target} ({r['seconds_to_target_loss_reached']}/{n}) | "
                    f"{pm(r['holdout_accuracy'], r['holdout_accuracy_sd'], 3)} |")
    return "\n".join(rows)
