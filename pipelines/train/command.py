"""The command line of the two training programs, the Horovod trainer (``pipelines.train.trainer``,
one per rank) and the parameter-server job (``pipelines.train.ps``, one per task): their options,
the input key of the result they make and the stored result that makes training unnecessary.
Their errors carry their exit codes (``TrainingError`` 2, ``DivergedError`` 4, ``ParameterServerLost``
3), which the programs' ``main`` (:func:`pipelines.errors.exit_codes`) ends with
(docs/ARCHITECTURE.md, "Failure rules").
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from pipelines.spec import SpecError, load_spec
from pipelines.stores.rundir import RunDir
from pipelines.sync.horovod_job import print_result
from pipelines.train.rank_job import DivergedError, TrainingError, read_plan
from pipelines.train.result import completed, train_input_key

log = logging.getLogger("pipelines.train")

# Options that change what is trained; part of the result's input key when set.
KEYED_OPTIONS = ("epochs", "global_batch", "max_steps", "no_balance")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Heterogeneous synchronous training with Horovod (one process per rank).")
    p.add_argument("--spec", required=True, help="job spec (file or inline JSON)")
    p.add_argument("--run-dir", required=True, help="run directory holding preload/, estimate/, lr_search/")
    p.add_argument("--plan", default=None, help="plan.json (default: <run-dir>/estimate/plan.json, else equal ranks)")
    p.add_argument("--epochs", type=int, default=None, help="override spec.training.epochs (default: spec)")
    p.add_argument("--global-batch", type=int, default=None, help="override the plan's global batch")
    p.add_argument("--window", type=int, default=10, help="steps per measurement window (default: %(default)s)")
    p.add_argument("--probe-steps", type=int, default=3, help="least timed calibration steps per rank (default: %(default)s)")
    p.add_argument("--probe-seconds", type=float, default=1.0, help="least calibration time per rank (default: %(default)s)")
    p.add_argument("--no-balance", action="store_true", help="planned batches, no calibration or re-balancing")
    p.add_argument("--measure-seconds", type=float, default=2.0,
                   help="least measured time behind a re-balance decision (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (benchmarks)")
    p.add_argument("--out", default=None, help="train output folder (default: <run-dir>/train)")
    p.add_argument("--fresh", action="store_true", help="train even if a result for the same inputs exists")
    return p.parse_args(argv)


def result_key(args: argparse.Namespace) -> str:
    """The input key of this job's result (:func:`pipelines.train.result.train_input_key`, as the
    local train stage computes it), from the files every rank reads."""
    run_dir = RunDir(args.run_dir)
    overrides = {k: v for k in KEYED_OPTIONS if (v := getattr(args, k))}
    try:
        return train_input_key(load_spec(args.spec), run_dir, read_plan(args.plan, run_dir), overrides)
    except (SpecError, FileNotFoundError) as e:
        raise TrainingError(str(e)) from None


def out_dir(args: argparse.Namespace) -> str:
    return args.out or os.path.join(args.run_dir, "train")


def train_once(args: argparse.Namespace, train: Callable[[str], dict[str, Any]], prints: bool) -> int:
    """A training program's work: the stored result of the same inputs (a file of the shared run
    directory, so every rank or task finds the same), else ``train(input key)``'s; printed as
    the last line of output when ``prints``.  Returns 0; a :class:`TrainingError` (or a
    :class:`pipelines.errors.ModelError`) stops it with its exit code (:func:`pipelines.errors.exit_codes`)."""
    key = result_key(args)
    done = None if args.fresh else completed(out_dir(args), key)
    if done is not None:
        log.info("already trained for these inputs (input key %s); returning the stored result", key)
    else:
        try:
            done = train(key)
        except DivergedError:
            log.error("the loss diverged: a retry would diverge again at the same step; lower training.learning_rate")
            raise
    if prints:
        print_result(done)
    return 0
