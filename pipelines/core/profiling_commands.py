"""The profiling sweep's command lines, shared by the local operators, the profiling pods and
``python -m pipelines render`` (docs/ARCHITECTURE.md, "Profiling a pool").

A sweep times a family of generated models on one device type and appends the timings to the
profile bank (``pipelines.estimate.sweep``); ``fit-bank`` fits each device type's regressions over
the bank; ``probe-allreduce`` measures a local pool's allreduce, and on Kubernetes each rank pod of
the probe runs :func:`probe_rank_command`; ``reference-runs`` trains reference models on a local
pool, and on Kubernetes their data comes from a pod running :func:`reference_data_command`.  Each,
asked with ``--json`` as every command line here does (the probe's ranks print theirs on rank 0),
prints its result as one JSON line last, and exits 2 on bad input,
3 on a failure a retry may fix (``pipelines.errors``).  The same command runs from a shell, in an
Airflow task and in a pod, as the stages' commands do (:func:`pipelines.core.stages.stage_command`).

Only the standard library and :mod:`pipelines.spec` are imported: the Airflow side imports this
module while parsing the ``profile_pool`` DAG.
"""

from __future__ import annotations

from pipelines.spec import SpecError

__all__ = [
    "SIZES",
    "DEFAULT_SIZE",
    "check_size",
    "sweep_source",
    "sweep_command",
    "profile_command",
    "fit_bank_command",
    "probe_allreduce_command",
    "probe_rank_command",
    "reference_runs_command",
    "reference_data_command",
]

# How many models and batches a sweep times: tiny (a smoke test, seconds), small (the default, a
# few minutes on two cores), medium, large.  The family itself is pipelines.estimate.sweep's.
SIZES: tuple[str, ...] = ("tiny", "small", "medium", "large")
DEFAULT_SIZE = "small"


def check_size(size: str) -> str:
    """``size`` when it is one of :data:`SIZES`; otherwise a :class:`SpecError` naming it."""
    if size not in SIZES:
        raise SpecError(f"size: {size!r} is not a sweep size; choose from {list(SIZES)}")
    return size


def sweep_source(dag_id: str, run_id: str) -> str:
    """What the bank records as the source of a sweep's rows: the Airflow run that made them."""
    return f"{dag_id}/{run_id}"


def _options(**values: str | int | None) -> list[str]:
    """``--name value`` for each value that is set, names with ``-`` for ``_``."""
    out: list[str] = []
    for name, value in values.items():
        if value is not None and value != "":
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def sweep_command(
    pool: str, device: str, launcher: str, bank: str, size: str, source: str, threads: int, python: str = "python"
) -> list[str]:
    """The device-side sweep: times the model family on the device it runs on (a profiling pod,
    or a process the local parent pinned and capped as ``device``) and appends rows to ``bank``.
    ``pool`` (a file or inline JSON) defines ``device``; ``launcher`` says which of its
    definitions (``local`` or ``kubernetes``) the rows are measured under.  The same list as
    ``pipelines.estimate.sweep.sweep_command`` (tests/k8s/test_profile_pods.py checks it)."""
    return [python, "-m", "pipelines.estimate.sweep", "--pool", pool, "--device", device, "--launcher", launcher,
            "--bank", bank, "--size", check_size(size), "--source", source, "--threads", str(threads)]


def profile_command(
    pool: str, device: str, size: str, *, bank: str | None = None, artifact_root: str | None = None,
    source: str | None = None, python: str = "python",
) -> list[str]:
    """The local parent: starts :func:`sweep_command` pinned to ``device``'s cores of ``pool`` and
    capped at its ``cpu_share``, as the local launcher places a rank."""
    return [python, "-m", "pipelines", "profile", "--pool", pool, "--device", device, "--size", check_size(size),
            *_options(bank=bank, artifact_root=artifact_root, source=source), "--json"]  # fmt: skip


def fit_bank_command(bank: str, *, out: str | None = None, python: str = "python") -> list[str]:
    """Fit every device type's step-time and memory regressions over ``bank``, with cross-validation."""
    return [python, "-m", "pipelines", "fit-bank", "--bank", bank, *_options(out=out), "--json"]


def probe_allreduce_command(
    pool: str, *, bank: str | None = None, artifact_root: str | None = None, python: str = "python"
) -> list[str]:
    """A short Gloo allreduce between ranks placed as ``pool``'s device types on this machine (a
    local pool; on Kubernetes the rank pods run :func:`probe_rank_command`); stores the pool's
    latency and bandwidth in the bank."""
    return [python, "-m", "pipelines", "probe-allreduce", "--pool", pool,
            *_options(bank=bank, artifact_root=artifact_root), "--json"]  # fmt: skip


def probe_rank_command(pool: str, launcher: str, bank: str, source: str, python: str = "python") -> list[str]:
    """What every rank pod of the Kubernetes probe runs (``python -m pipelines.estimate.probe``,
    the local probe's rank program): ``pool`` (inline JSON: the pod cannot read the pool file)
    and ``launcher`` name the pool's key in the bank; rank 0 appends the fitted link to ``bank``
    (``source`` recorded with it) and prints it as its last line."""
    return [python, "-m", "pipelines.estimate.probe", "--pool", pool, "--launcher", launcher, "--bank", bank,
            "--source", source]


def reference_runs_command(
    pool: str, *, bank: str | None = None, artifact_root: str | None = None, python: str = "python"
) -> list[str]:
    """Short real trainings of reference models on a local pool, recorded in the bank
    (``pipelines.estimate.reference``): what synchronous training costs on the pool."""
    return [python, "-m", "pipelines", "reference-runs", "--pool", pool,
            *_options(bank=bank, artifact_root=artifact_root), "--json"]  # fmt: skip


def reference_data_command(out: str, *, rows_per_day: int, days: int, python: str = "python") -> list[str]:
    """Write the reference runs' generated data to ``out`` unless it is there already
    (``python -m pipelines.estimate.reference``, :func:`pipelines.estimate.reference.ensure_data`):
    on Kubernetes a pod runs it on the artifact volume, where the runs' pods read the data."""
    return [python, "-m", "pipelines.estimate.reference", "--data", out, "--rows-per-day", str(rows_per_day),
            "--days", str(days)]
