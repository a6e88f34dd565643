"""The ``profile_pool`` DAG's operators: list a pool's device types, sweep the profiling model
family on each (one mapped task per type), probe the pool's allreduce, train the reference models,
and fit the profile bank (docs/ARCHITECTURE.md, "Profiling a pool").

Each task runs one command of :mod:`pipelines.core.profiling_commands` and returns its last JSON line as XCom;
exit 2 (bad input) fails the task without retries, anything else is retried:

- ``launcher: local``: the command runs as a subprocess in the trainer environment
  (:class:`hetero.runners.local_runner.LocalCommandRunner`, as the stages do).  ``python -m pipelines profile``
  pins and caps the sweep as the device type says.  Sweeps on one machine would disturb each
  other's timings, so each holds a machine-wide lock file while it runs (:func:`sweep_lock`); the
  allreduce probe holds it too.
- ``launcher: kubernetes``: each sweep is a pod of its own with its device type's resources and
  placement, in parallel (a gang of one pod, :func:`hetero.runners.gang_runner.profile_job`), and so is the fit.
  The allreduce probe is a Horovod gang of rank pods spanning the pool's device types, built as a
  training's (:func:`hetero.runners.gang_runner.probe_job`), whose rank 0 stores the link in the
  bank; the reference runs train through the training's own runners
  (:class:`hetero.runners.reference_runner.ReferenceRunsRunner`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, Param
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from hetero.operators import RunnerOperator, no_retry_for_bad_ranks
from hetero.params import default_job, job_params
from hetero.runners.local_runner import LocalCommandRunner, trainer_python
from hetero.runners.protocol import Runner
from hetero.task_context import PROJECT_ROOT, stage_context
from pipelines.core.profiling_commands import (
    DEFAULT_SIZE,
    SIZES,
    check_size,
    fit_bank_command,
    probe_allreduce_command,
    profile_command,
    reference_runs_command,
    sweep_source,
)
from pipelines.spec import JobSpec, SpecError, load_pool, load_spec
from pipelines.spec.defaults import deep_merge

__all__ = [
    "PARAMS",
    "ENV_LOCK",
    "ProfileRun",
    "profile_params",
    "profile_run",
    "sweep_lock",
    "PoolDeviceTypesOperator",
    "ProfileSweepOperator",
    "AllreduceProbeOperator",
    "ReferenceRunsOperator",
    "BankFitOperator",
]

PARAMS = ("pool", "size", "launcher", "artifact_root", "profile_bank", "reference_runs", "kubernetes")
SPEC_PARAMS = ("pool", "launcher", "artifact_root", "kubernetes")  # the job spec's own fields
ENV_LOCK = "HETERO_PROFILE_LOCK"  # the machine-wide lock file of local sweeps
# What the bank Asset's event says of each device type's fit (the laws themselves stay in the XCom).
EVENT_FIT_FIELDS = ("rows", "models", "step_model", "step_cv_mape", "memory_model", "memory_cv_mape")


def profile_params() -> dict:
    """The DAG's Params: ``pool``, ``launcher``, ``artifact_root`` and ``kubernetes`` exactly as the
    training DAG's form has them (schema and defaults from the job spec), plus ``size`` and
    ``profile_bank``."""
    job = job_params()
    params = {name: job[name] for name in SPEC_PARAMS}
    params["size"] = Param(
        DEFAULT_SIZE, type="string", enum=list(SIZES), title="size",
        description="How many models and batches each device type times: tiny (a smoke test), small (a few "
        "minutes a device type on two cores), medium, large.",
    )  # fmt: skip
    params["profile_bank"] = Param(
        None, type=["string", "null"], title="profile_bank",
        description="Where the profile bank lives: a path or s3://, gs://, hdfs:// URI. Empty: "
        "<artifact_root>/_profiles (the job spec's estimate.profile_bank).",
    )  # fmt: skip
    params["reference_runs"] = Param(
        True, type="boolean", title="reference_runs",
        description="Also train two small reference models through the pipeline (locally about a minute; on "
        "Kubernetes as pods and a Horovod gang) so that the first run of any model on the pool is predicted with the "
        "pool's synchronous costs.",
    )  # fmt: skip
    return {name: params[name] for name in PARAMS}


@dataclasses.dataclass(frozen=True)
class ProfileRun:
    """A run's validated params: ``spec`` carries the pool, launcher, artifact root, Kubernetes
    settings and bank (``spec.profile_bank_uri()``); ``pool`` is the pool file as the trainer
    environment reads it (relative paths taken under the project root)."""

    spec: JobSpec
    size: str
    pool: str
    reference_runs: bool = True

    @property
    def bank(self) -> str:
        return self.spec.profile_bank_uri()


def profile_run(params: dict) -> ProfileRun:
    """The run's params checked as the job spec checks them; :class:`SpecError` names each bad
    field, a misspelt key (Airflow merges a run's conf into its params) and a pool that cannot be read."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        lines = [f"profile_pool params: {len(unknown)} unknown field(s)"]
        for key in unknown:
            close = difflib.get_close_matches(key, list(PARAMS), n=1)
            lines.append(f"  {key}: unknown field" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise SpecError("\n".join(lines))
    job = default_job()  # the deployment's defaults (HETERO_JOB_DEFAULTS) included
    pool = _pool_path(params.get("pool") or job["pool"])
    doc = {**job, "pool": pool}  # the dataset is the form's default: a sweep reads none
    # a conf's kubernetes section changes only the keys it names, as in the training DAG
    doc = deep_merge(doc, {k: params[k] for k in ("launcher", "artifact_root", "kubernetes") if params.get(k) is not None})
    doc["estimate"] = {"profile_bank": params.get("profile_bank") or ""}
    spec = load_spec(doc)
    load_pool(pool)  # a bad pool fails here, naming the file and its fields
    return ProfileRun(spec=spec, size=check_size(params.get("size") or DEFAULT_SIZE), pool=pool,
                      reference_runs=params.get("reference_runs") is not False)


def _pool_path(pool: Any) -> str:
    """A pool file path as the trainer environment reads it: relative paths under the project root,
    where local commands run (inline JSON as it is)."""
    if isinstance(pool, dict):
        return json.dumps(pool)
    text = str(pool).strip()
    if text.startswith("{") or Path(text).is_absolute():
        return text
    return str(PROJECT_ROOT / text)


def checked_run(context) -> ProfileRun:
    """:func:`profile_run` of the task's params; bad params fail the task without retries."""
    try:
        return profile_run(context["params"])
    except SpecError as e:
        raise AirflowFailException(str(e)) from None


@contextlib.contextmanager
def fail_bad_input() -> Iterator[None]:
    """A bad device type or Kubernetes setting (:class:`SpecError`), or a pod that exited 2, fails
    the task without retries: the next try would meet the same input."""
    try:
        with no_retry_for_bad_ranks():
            yield
    except SpecError as e:
        raise AirflowFailException(str(e)) from None


@contextlib.contextmanager
def sweep_lock(what: str, path: str | None = None, *, poll_s: float = 2.0, log: Any = None) -> Iterator[Path]:
    """Hold the machine-wide lock of local sweeps (``HETERO_PROFILE_LOCK``, default
    ``<tmp>/hetero-profile.lock``) while the block runs; wait for it, saying who holds it.

    A lock file rather than ``max_active_tis_per_dagrun=1``: the launcher is a run's param, known
    only when the task runs, and Kubernetes sweeps (each in a pod of its own) should run in
    parallel; the lock also keeps a sweep of another DAG run off the cores.  The kernel releases it
    when the holder's process ends, however it ends (the descriptor is not inherited by the sweep)."""
    lock = Path(path or os.environ.get(ENV_LOCK) or Path(tempfile.gettempdir()) / "hetero-profile.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and log is not None:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another sweep"
                    log.info("Waiting for %s to finish (lock %s): sweeps on one machine run one at a time", holder, lock)
                waited = True
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})\n".encode(), 0)
        yield lock
    finally:
        os.close(fd)  # releases the lock


class PoolDeviceTypesOperator(BaseOperator):
    """The pool's device type names, in the pool's order: what the ``sweep`` task is mapped over.
    Bad params or a bad pool fail here, before any sweep starts, without retries."""

    ui_color = "#f0f0e0"

    def execute(self, context) -> list[str]:
        run = checked_run(context)
        names = [d.name for d in load_pool(run.pool).device_types]
        self.log.info("Profiling %d device type(s) of %s at size %s: %s", len(names), run.pool, run.size, names)
        return names


class _ProfileTask(RunnerOperator):
    """What the profiling tasks share: a local command in the trainer environment, or a pod."""

    lock_poll_s = 2.0  # how often a local task waiting for the sweep lock tries again

    def __init__(self, *, poll_interval: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval = poll_interval

    def guard(self) -> AbstractContextManager:
        return fail_bad_input()

    def local_runner(self, what: str, cmd: list[str], *, lock: bool) -> Runner:
        """``cmd`` as a subprocess; with ``lock``, holding the machine-wide sweep lock (:func:`sweep_lock`)."""
        hold = (lambda: sweep_lock(what, poll_s=self.lock_poll_s, log=self.log)) if lock else contextlib.nullcontext
        return LocalCommandRunner(what, cmd, hold)

    def pod_runner(self, run: ProfileRun, device: str | None = None, *, source: str | None = None,
                   probe: bool = False) -> Runner:
        """The sweep on ``device`` (none: the bank's fit) as a gang of one pod; with ``probe`` the
        allreduce probe's gang of rank pods."""
        # Imported here: the gang runner imports the cncf.kubernetes provider (about 1.7 s), which
        # the parse of the DAG file, and local runs, would otherwise pay.
        from hetero.runners import gang_runner

        if probe:
            job = gang_runner.probe_job(run.spec, pool=run.pool, source=source)
        else:
            job = gang_runner.profile_job(run.spec, device, size=run.size, source=source)
        return gang_runner.GangRunner(job, run.spec, deferrable=run.spec.kubernetes.deferrable,
                                      poll_interval=self.poll_interval, log=self.log)


class ProfileSweepOperator(_ProfileTask):
    """Sweep the profiling model family on one device type of the pool and append the rows to the
    profile bank; returns the sweep's result line (``device``, ``rows``, ``models``, ``bank``,
    ``seconds``, ``source``).  Mapped over the pool's device types (``.expand(device=...)``).

    :param device: the device type. (templated)
    """

    template_fields = ("device",)
    ui_color = "#e8f2e0"

    def __init__(self, *, device: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.device = device

    def make_runner(self, context) -> Runner:
        run = checked_run(context)
        ctx = stage_context(context)
        source = sweep_source(ctx.dag_id, ctx.run_id)
        if run.spec.launcher != "local":
            return self.pod_runner(run, self.device, source=source)
        cmd = profile_command(run.pool, self.device, run.size, bank=run.bank, source=source, python=trainer_python())
        return self.local_runner(f"profiling sweep on {self.device!r}", cmd, lock=True)


class AllreduceProbeOperator(_ProfileTask):
    """Time a short Gloo allreduce between ranks placed as the pool's device types and store the
    pool's latency and bandwidth in the bank under its key for the launcher (pools of two devices or
    more; skipped for a single device).  Locally the ranks are processes pinned and capped as
    their types; on Kubernetes a gang of rank pods built as a training's, whose rank 0 stores the
    row (:func:`hetero.runners.gang_runner.probe_job`)."""

    ui_color = "#e8f2e0"

    def make_runner(self, context) -> Runner:
        run = checked_run(context)
        if sum(d.count for d in load_pool(run.pool).device_types) < 2:
            raise AirflowSkipException(f"pool {run.pool} has one device: no allreduce to measure")
        if run.spec.launcher != "local":
            ctx = stage_context(context)
            return self.pod_runner(run, source=sweep_source(ctx.dag_id, ctx.run_id), probe=True)
        cmd = probe_allreduce_command(run.pool, bank=run.bank, python=trainer_python())
        return self.local_runner("allreduce probe", cmd, lock=True)


class ReferenceRunsOperator(_ProfileTask):
    """Two short real trainings of reference models on the pool, through the pipeline's own
    stages, recorded in the bank: the pool's synchronous costs, learned before any user's run
    (pools of two devices or more; skipped for a single device).  Locally ``python -m pipelines
    reference-runs``; on Kubernetes the stages' pods and the Horovod train gang, through the
    training's runners (:class:`hetero.runners.reference_runner.ReferenceRunsRunner`)."""

    ui_color = "#e8f2e0"

    def make_runner(self, context) -> Runner:
        run = checked_run(context)
        if sum(d.count for d in load_pool(run.pool).device_types) < 2:
            raise AirflowSkipException(f"pool {run.pool} has one device: nothing synchronous to learn")
        if not run.reference_runs:
            raise AirflowSkipException("reference_runs is off")
        if run.spec.launcher != "local":
            from hetero.runners.reference_runner import ReferenceRunsRunner

            return ReferenceRunsRunner(run.spec, run.pool, run.bank, poll_interval=self.poll_interval, log=self.log)
        cmd = reference_runs_command(run.pool, bank=run.bank, artifact_root=run.spec.artifact_root,
                                     python=trainer_python())
        return self.local_runner("reference runs", cmd, lock=True)


class BankFitOperator(_ProfileTask):
    """Fit every device type's step-time and memory regressions over the bank, with
    cross-validation; returns the fit's result line (``bank``, ``device_types``).  Its outlets (the
    bank's Asset) get an event whose ``extra`` carries the bank and each type's fit summary
    (:data:`EVENT_FIT_FIELDS`)."""

    ui_color = "#e4ecf7"

    def make_runner(self, context) -> Runner:
        run = checked_run(context)
        if run.spec.launcher != "local":
            return self.pod_runner(run)
        return self.local_runner("fitting the profile bank", fit_bank_command(run.bank, python=trainer_python()),
                                 lock=False)

    def finish(self, context, result: dict) -> dict:
        """The Assets' events carry the bank and, per device type, the fit's summary (not its laws)."""
        if self.outlets:
            fits = {name: {k: fit[k] for k in EVENT_FIT_FIELDS if k in fit}
                    for name, fit in (result.get("device_types") or {}).items()}
            for outlet in self.outlets:
                context["outlet_events"][outlet].extra = {"bank": result.get("bank"), "device_types": fits}
        return result
