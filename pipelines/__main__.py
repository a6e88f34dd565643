"""``python -m pipelines <command>``: run one stage, render manifests, make sample data, or show a DAG's history.

A command prints a short summary for people (``pipelines.core.summary``) and exits 0; with
``--json`` it prints its result as one JSON line instead, the last line of standard output (what
the Airflow tasks and pods ask for and read).  A stage's result is also ``<run dir>/<stage>/result.json``.
On failure it prints ``ERROR: <cause>`` to standard error and exits non-zero.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from pathlib import Path

from pipelines.analyze.history import history_command, refresh_history
from pipelines.core.stages import ALIASES, STAGES, StageContext, canonical, resolve
from pipelines.core.summary import summary_lines
from pipelines.data.sample import generate
from pipelines.errors import exit_codes
from pipelines.estimate.probe import probe_pool
from pipelines.estimate.reference import reference_runs
from pipelines.estimate.regress import bank_report
from pipelines.estimate.sweep import profile_device
from pipelines.launch.k8s.cluster_check import check_cluster_command
from pipelines.launch.lifetime import die_with_parent
from pipelines.launch.render import render_cli
from pipelines.spec import JobSpec, load_pool, load_spec, pool_profiles_path, read_mapping
from pipelines.stores.rundir import RunDir, write_json

log = logging.getLogger("pipelines")

# What each stage command does, for --help and docs/reference/cli.md.
STAGE_HELP = {
    "preload": "validate the Parquet dataset and convert the run's partitions once into training shards, "
    "the held-out rows split off",
    "estimate": "predict each device type's step time and memory from the profile bank and choose the plan: "
    "ranks, batches, strategy",
    "lr_search": "a learning-rate range test on the plan's ranks, and the rate it chooses",
    "train": "train on the plan's ranks and write the model, checkpoints and summary",
    "publish": "copy the trained model into the model store as a new immutable version",
    "analyze": "evaluate on the held-out rows, write the report and record the run in the profile bank",
    "promote": "make this run's version the promoted one when promotion.mode and the comparison allow it",
}


def _datetime(value: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO date-time: {value!r}") from None


def _json_option(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print the result as one JSON line (the last line of "
                   "standard output) instead of a summary for people, as the Airflow tasks and pods run it")
    return p


def _stage_parser(sub: argparse._SubParsersAction, name: str) -> None:
    aliases = [old for old, new in ALIASES.items() if new == name]
    p = sub.add_parser(name, aliases=aliases, help=f"the {name} stage: {STAGE_HELP[name]}")
    p.add_argument("--spec", required=True, help="job spec: YAML/JSON file or inline JSON")
    p.add_argument("--run-dir", help="run directory (default: <artifact_root>/<dag_id>/<run_id>)")
    p.add_argument("--dag-id", default="cli", help="Airflow DAG id, or any name (default: %(default)s)")
    p.add_argument("--run-id", default="manual", help="Airflow run id, or any name (default: %(default)s)")
    p.add_argument("--try-number", type=int, default=1, help="Airflow try number (default: %(default)s)")
    p.add_argument("--data-interval-start", type=_datetime, help="start of the run's data interval")
    p.add_argument("--data-interval-end", type=_datetime, help="end of the run's data interval")
    p.add_argument("--fresh", action="store_true", help="recompute even if a result for the same inputs exists")
    p.add_argument("--pool", help="pool: YAML/JSON file or inline JSON (default: the spec's pool file); "
                   "copied into the run directory as pool.json, which the saved spec then names")
    p.add_argument("--profiles", help="pre-measured device profiles: JSON file or inline JSON (default: "
                   "<pool stem>.profiles.json beside a pool file, if there); copied beside the run's pool.json")
    _json_option(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in STAGES:
        _stage_parser(sub, name)
    g = sub.add_parser("generate-data", help="write the sample shapes dataset as day-partitioned Parquet")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--rows-per-day", type=int, default=2000, help="rows in each day's partition (default: %(default)s)")
    g.add_argument("--days", type=int, default=3, help="number of daily partitions (default: %(default)s)")
    g.add_argument("--start", default="2026-01-01", help="first day YYYY-MM-DD (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    pr = sub.add_parser("profile", help="profiling sweep: time the model family on one device type of a local pool "
                        "(pinned and capped as the type) into the profile bank")
    pr.add_argument("--pool", required=True, help="pool: YAML/JSON file or inline JSON")
    pr.add_argument("--device", required=True, help="device type name")
    pr.add_argument("--size", default="small", help="sweep size: tiny, small, medium or large (default: %(default)s)")
    pr.add_argument("--bank", help="profile bank URI (default: <artifact root>/_profiles)")
    pr.add_argument("--artifact-root", default="artifacts", help="default bank location (default: %(default)s)")
    pr.add_argument("--source", help="the sweep's id recorded in its rows (default: a new one)")
    fb = sub.add_parser("fit-bank", help="fit the per-device-type regressions of the profile bank and report them")
    fb.add_argument("--bank", help="profile bank URI (default: <artifact root>/_profiles)")
    fb.add_argument("--artifact-root", default="artifacts", help="default bank location (default: %(default)s)")
    fb.add_argument("--out", help="also write the report to this JSON file")
    pa = sub.add_parser("probe-allreduce", help="measure a local pool's allreduce latency and bandwidth into the profile bank")
    pa.add_argument("--pool", required=True, help="pool: YAML/JSON file or inline JSON")
    pa.add_argument("--bank", help="profile bank URI (default: <artifact root>/_profiles)")
    pa.add_argument("--artifact-root", default="artifacts", help="default bank location (default: %(default)s)")
    rr = sub.add_parser("reference-runs", help="short real trainings of reference models on a local pool, recorded in "
                        "the profile bank so the first run of any model there is predicted with the pool's corrections")
    rr.add_argument("--pool", required=True, help="pool file")
    rr.add_argument("--bank", help="profile bank URI (default: <artifact root>/_profiles)")
    rr.add_argument("--artifact-root", default="artifacts", help="default bank location (default: %(default)s)")
    rr.add_argument("--workdir", help="where the generated data and the runs go (default: <artifact root>/_reference)")
    r = sub.add_parser("render", help="write the Kubernetes manifests a job would create, without a cluster")
    r.add_argument("--spec", required=True, help="job spec: YAML/JSON file or inline JSON")
    r.add_argument("--pool", help="pool file (default: the spec's)")
    r.add_argument("--plan", help="plan.json from the estimate stage (default: one rank per device in the pool)")
    r.add_argument("--out", required=True, help="folder for the YAML manifests")
    r.add_argument("--dag-id", default="cli", help="Airflow DAG id, or any name: names the pods and the run "
                   "directory (default: %(default)s)")
    r.add_argument("--run-id", default="manual", help="Airflow run id, or any name: names the pods and the run "
                   "directory (default: %(default)s)")
    r.add_argument("--profile-pods", action="store_true",
                   help="write the profile_pool DAG's pods instead: profile-<device>.yaml and profile-fit.yaml")
    r.add_argument("--size", default="small", help="with --profile-pods: the sweep's size (default: %(default)s)")
    cc = sub.add_parser("check-cluster", help="check the live cluster for a Kubernetes job: namespace, RBAC, the "
                        "artifact claim, a node for each device type, GPUs, images (needs the kubernetes client: "
                        "run it with .venv/bin/python)")
    cc.add_argument("--spec", help="job spec: YAML/JSON file or inline JSON, deep-merged over the deployment's job "
                    "defaults (HETERO_JOB_DEFAULTS) as a run's conf is (default: the defaults alone)")
    cc.add_argument("--pool", help="pool: YAML/JSON file or inline JSON (default: the spec's)")
    cc.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config; without one, "
                    "the in-cluster service account)")
    cc.add_argument("--context", help="kubeconfig context (default: its current context)")
    h = sub.add_parser("history", help="the history of a DAG's analysed runs: a line per run, and a page of figures "
                       "per model and pool (held-out accuracy per version, predicted and actual run time, "
                       "throughput, balance, learning rate)")
    h.add_argument("--artifact-root", required=True, help="the artifact root the runs are under")
    h.add_argument("--dag-id", required=True, help="the DAG whose runs are read: <artifact root>/<dag id>/")
    h.add_argument("--model", help="only the runs of this model (its name in the model store)")
    h.add_argument("--pool", help="only the runs on this pool, named by its device types and counts, e.g. fast:1,slow:1")
    h.add_argument("--out", help="write the page here (default: <artifact root>/<dag id>/history.html, only "
                   "when neither --model nor --pool is given)")
    for command in (g, pr, fb, pa, rr, r, cc, h):
        _json_option(command)
    return parser


def save_inputs(spec: JobSpec, run_dir: RunDir, pool: str | None = None, profiles: str | None = None) -> JobSpec:
    """Copy the run's inputs into the run directory and return the spec that names the copies.

    The pool (``pool``, else the spec's) becomes ``<run dir>/pool.json`` and its profiles override
    (``profiles``, else ``<pool stem>.profiles.json`` beside a pool file) ``pool.profiles.json``
    beside it, or none.  Every later reader (the stages, the ranks) then reads them from the run
    directory, which pods share, and never a path that only the Airflow side has.
    """
    source = pool or spec.pool
    load_pool(source)  # a bad pool fails here, before any work, naming the file and its fields
    doc, where = read_mapping(source, "pool")
    side_doc = read_mapping(profiles, "profiles")[0] if profiles else None
    if side_doc is None and where == str(source).strip() and pool_profiles_path(where).is_file():
        side_doc = read_mapping(pool_profiles_path(where), "profiles")[0]
    write_json(run_dir.pool_path, doc)
    side = pool_profiles_path(run_dir.pool_path)
    if side_doc is not None:
        write_json(side, side_doc)
    elif side.exists():
        side.unlink()  # an older override of another pool
    return spec.model_copy(update={"pool": str(run_dir.pool_path)})


def run_stage(args: argparse.Namespace) -> dict:
    spec = load_spec(args.spec)
    ctx = StageContext(
        dag_id=args.dag_id,
        run_id=args.run_id,
        try_number=args.try_number,
        data_interval_start=args.data_interval_start,
        data_interval_end=args.data_interval_end,
        fresh=args.fresh,
    )
    run_dir = RunDir(args.run_dir) if args.run_dir else RunDir.for_run(spec.artifact_root, ctx.dag_id, ctx.run_id)
    run_dir.root.mkdir(parents=True, exist_ok=True)
    spec = save_inputs(spec, run_dir, args.pool, args.profiles)
    write_json(run_dir.root / "spec.json", json.loads(spec.to_json()))
    stage = canonical(args.command)
    func = resolve(stage)
    started = time.time()
    result = func(spec, run_dir, ctx)
    result.setdefault("stage", stage)
    result.setdefault("run_dir", str(run_dir))
    result.setdefault("seconds", round(time.time() - started, 3))
    write_json(run_dir.result_path(stage), result)
    if stage == "promote":  # the history page marks the promoted version (analyze, earlier, drew the rest)
        refresh_history(run_dir, ctx.dag_id, ctx.run_id)
    return result


def bank_command(args: argparse.Namespace) -> dict:
    """``profile``, ``fit-bank``, ``probe-allreduce`` and ``reference-runs``: the profile bank's commands."""
    bank = args.bank or str(Path(args.artifact_root) / "_profiles")
    if args.command == "profile":
        return profile_device(args.pool, args.device, bank, args.size, source=args.source)
    if args.command == "reference-runs":
        return reference_runs(args.pool, bank, args.workdir or str(Path(args.artifact_root) / "_reference"))
    if args.command == "probe-allreduce":
        return probe_pool(args.pool, bank)
    report = bank_report(bank)
    if args.out:
        write_json(args.out, report)
    return report


@exit_codes
def main(argv: list[str] | None = None) -> int:
    """Run one command; print its summary, or with ``--json`` its result as the last line of standard
    output.  Errors end it with one ``ERROR:`` line and their exit code: 2 bad input (a model that
    cannot be built among them), 3 a failure a retry may fix (pipelines.errors.exit_codes;
    docs/ARCHITECTURE.md, "Failure rules")."""
    die_with_parent()  # run by an Airflow task: end (and stop the ranks) when the task process dies
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "check-cluster":
        return check_cluster_command(args)  # prints its own lines; exit 2 naming what to fix
    if args.command == "generate-data":
        result = generate(args.out, rows_per_day=args.rows_per_day, days=args.days, start=args.start, seed=args.seed)
    elif args.command in ("profile", "fit-bank", "probe-allreduce", "reference-runs"):
        result = bank_command(args)
    elif args.command == "render":
        result = render_cli(args)
    elif args.command == "history":
        result = history_command(args)
    else:
        result = run_stage(args)
    text = json.dumps(result, sort_keys=True, default=str)
    if args.json:
        print(text, flush=True)
    else:
        log.debug("result: %s", text)
        command = canonical(args.command) if args.command in (*STAGES, *ALIASES) else args.command
        print("\n".join(summary_lines(command, result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
