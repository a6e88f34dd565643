"""bench/first_run.py on the local launcher (trainer environment): the pool profiled as the
profile_pool DAG's local tasks do it, then each first run through bench/estimator.py's
:func:`evaluate` (the real stages, ``estimate.calibrate: never``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import estimator  # bench/estimator.py: evaluate(), one run through the stages, predicted from the bank
from first_run import DEVICE_NAMES, first_run_record

from pipelines.data.sample import generate
from pipelines.estimate.probe import probe_pool
from pipelines.estimate.reference import REFERENCE_MODELS, reference_runs
from pipelines.estimate.regress import bank_report
from pipelines.estimate.sweep import profile_device


def profile_pool(pool: str, bank: str, work: Path, size: str, references: int) -> dict[str, Any]:
    """What the profile_pool DAG runs on a local pool, in its order (``python -m pipelines profile``,
    ``probe-allreduce``, ``reference-runs``, ``fit-bank`` are these functions): a sweep per device
    type, the allreduce probe, the reference runs (the first ``references``), the bank's fit."""
    sweeps = [profile_device(pool, device, bank, size) for device in DEVICE_NAMES]
    link = probe_pool(pool, bank)
    reference = (reference_runs(pool, bank, work / "reference", models=REFERENCE_MODELS[:references])
                 if references else {"runs": []})
    fit = bank_report(bank)
    return {"sweeps": sweeps, "link": link, "reference": reference, "fit": fit}


def measure(args: argparse.Namespace, pool: dict[str, Any], runs: tuple, work: Path) -> dict[str, Any]:
    started = time.time()
    pool_path = work / "pool.json"
    pool_path.write_text(json.dumps(pool, indent=1))
    bank = work / "bank"
    fresh = not bank.exists()
    profiled = profile_pool(str(pool_path), str(bank), work, args.size, args.references)
    profile_s = time.time() - started
    print(f"profile_pool: {profile_s:.1f} s ({sum(s['rows'] for s in profiled['sweeps'])} sweep rows, "
          f"{len(profiled['reference']['runs'])} reference runs)", flush=True)
    data = work / "data"
    generate(str(data), rows_per_day=args.rows_per_day, days=3)
    records, enforced = [], [s["quota_enforced"] for s in profiled["sweeps"]] + [profiled["link"]["quota_enforced"]]
    for i, (model, kwargs, global_batch) in enumerate(runs):
        estimator.evaluate(str(pool_path), work, data, str(bank), i, model, kwargs, global_batch)
        run_dir = work / "runs" / f"eval-{i}"  # estimator.evaluate's run directory
        stage = {name: json.loads((run_dir / name / "result.json").read_text()) for name in ("estimate", "train", "analyze")}
        records.append(first_run_record(model, kwargs, global_batch, stage["estimate"], stage["analyze"]))
        enforced.append(stage["train"].get("quota_enforced"))
    return {"runs": records, "profile_pool_seconds": round(profile_s, 1), "quota_enforced": all(e is True for e in enforced),
            "bank": {"uri": str(bank), "fresh": fresh}, "seconds": round(time.time() - started, 1),
            "profile": {"sweeps": profiled["sweeps"], "link": profiled["link"],
                        "reference_run_errors": [r["error"] for r in profiled["reference"]["runs"]],
                        "fit": profiled["fit"]}}
