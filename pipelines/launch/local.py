"""Local Horovod launcher: N rank processes on this machine over Gloo, each as its own "device".

Behaves like ``horovodrun -np N --gloo`` on localhost, plus per-rank device profiles from a pool
file (CPU cores and a CPU quota enforced through cgroups), so an existing Horovod TensorFlow 2
script runs under it unchanged::

    python -m pipelines.launch.local -np 2 --pool examples/pool-local.yaml --profiles fast,slow -- \\
        python my_script.py --its-args

When one rank exits non-zero (or the launcher is told to stop), every other rank is stopped;
the launcher exits with the failed rank's code and prints that rank's last lines.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipelines.core.plan import plan_strategy
from pipelines.core.stages import ps_command, rank_command
from pipelines.errors import EXIT_DIVERGED, EXIT_FAILED, NO_RETRY, StageError, StageFailure, child_error
from pipelines.launch.cgroups import PERIOD_US, CpuLimiter, threads_for
from pipelines.launch.lifetime import child_env, die_with_parent, stop_earlier_tries, try_env
from pipelines.launch.ports import free_ports
from pipelines.launch.rendezvous import (
    ENV_DEVICE,
    ENV_SHARE,
    ENV_THREADS,
    gloo_env,
    local_slots,
    start_rendezvous,
)
from pipelines.launch.tfconfig import ENV, cluster_spec, tasks, tf_config
from pipelines.spec import load_pool

log = logging.getLogger("pipelines.launch")

TAIL_LINES = 30


@dataclasses.dataclass(frozen=True)
class Profile:
    """How one rank is placed: a device type name, cores and CPU share (None: unlimited)."""

    device: str = "default"
    cpus: tuple[int, ...] = ()
    cpu_share: float | None = None
    cpu_period_ms: float = PERIOD_US / 1000


@dataclasses.dataclass
class LaunchResult:
    returncode: int
    failed_rank: int | None
    tails: dict[int, list[str]]
    seconds: float
    quota_enforced: bool
    message: str = ""


def profiles_from_pool(pool_path: str, names: Sequence[str]) -> list[Profile]:
    """Profiles for the given device type names, read from a pool file."""
    pool = load_pool(pool_path)
    out = []
    for name in names:
        d = pool.get(name)
        out.append(Profile(device=name, cpus=tuple(d.local.cpus), cpu_share=d.local.cpu_share,
                           cpu_period_ms=d.local.cpu_period_ms))
    return out


def launch_plan(stage: str, spec, run_dir, ctx, plan: dict) -> LaunchResult:
    """The plan's ranks running ``stage``'s rank program (``pipelines.core.stages.rank_command``) on
    this machine, each with its device type's profile from the spec's pool (see :func:`this_try`)."""
    profiles = profiles_from_pool(spec.pool, [r["device"] for r in plan["ranks"]])
    job, env = this_try(stage, ctx)
    return launch(rank_command(str(run_dir), sys.executable, fresh=ctx.fresh, stage=stage), profiles, job=job, env=env)


def this_try(stage: str, ctx, suffix: str = "") -> tuple[str, dict[str, str]]:
    """A local job of ``stage`` in this task try: its cgroup name (after the run, the try and the
    stage) and the environment that marks its processes as this try's.  Processes of an earlier
    try of the same run's stage still alive are stopped first
    (``pipelines.launch.lifetime.stop_earlier_tries``)."""
    job = f"{ctx.dag_id}-{ctx.run_id}-{ctx.try_number}-{stage}{suffix}"[-64:]
    run = f"{ctx.dag_id}/{ctx.run_id}"
    if killed := stop_earlier_tries(run, ctx.try_number, stage):
        log.warning("stopped %d process(es) of an earlier try of %s %s still running: %s", len(killed), run, stage, killed)
    env = {**os.environ, **try_env(run, ctx.try_number, stage)}
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in job), env


def launch_ps_plan(stage: str, spec, run_dir, ctx, plan: dict) -> LaunchResult:
    """The plan's parameter-server job on this machine: a worker per plan rank, placed as its
    device type (cores and CPU quota, as a Horovod rank), the chief and
    ``training.parameter_servers`` servers unplaced; every task on a free port of 127.0.0.1."""
    workers = profiles_from_pool(spec.pool, [r["device"] for r in plan["ranks"]])
    num_ps = spec.training.parameter_servers
    ports = free_ports(1 + len(workers) + num_ps)
    cluster = cluster_spec(f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{p}" for p in ports[1 : 1 + len(workers)]],
                           [f"127.0.0.1:{p}" for p in ports[1 + len(workers) :]])
    job, env = this_try(stage, ctx, "-ps")
    return launch_ps(ps_command(str(run_dir), sys.executable, fresh=ctx.fresh), cluster, workers, job=job, env=env)


def run_stage_ranks(stage: str, what: str, spec, run_dir, ctx, plan: dict, stored, where) -> dict:
    """A rank stage's local path (train, lr_search): start the plan's ranks (:func:`launch_plan`),
    map a failure to the stage's error (:func:`raise_for_ranks`), and return rank 0's stored
    result (``stored()``, None when it left none for these inputs at ``where``) with what the
    launcher knows added: ``quota_enforced`` and ``launcher_seconds``."""
    if spec.launcher != "local":
        raise StageError(f"the {stage} stage runs ranks locally; with launcher=kubernetes the HorovodJobOperator starts the pods")
    ps = stage == "train" and plan_strategy(spec, plan) == "parameter_server"
    result = (launch_ps_plan if ps else launch_plan)(stage, spec, run_dir, ctx, plan)
    raise_for_ranks(what, result)
    done = stored()
    if done is None:
        raise StageFailure(f"{what} ended but rank 0 left no result for these inputs in {where}")
    return {**done, "quota_enforced": result.quota_enforced, "launcher_seconds": result.seconds}


def raise_for_ranks(stage: str, result: LaunchResult) -> None:
    """Nothing when every rank succeeded; otherwise the stage's error by the failed rank's exit
    code: bad input (2) or a diverged loss (4) as :class:`StageError` (the stage exits 2: no
    retry), anything else (a crash, a signal, a time limit) as :class:`StageFailure` (exit 3:
    retried) (docs/ARCHITECTURE.md, "Failure rules")."""
    if result.returncode == 0:
        return
    lines = (result.tails.get(result.failed_rank) or []) if result.failed_rank is not None else []
    tail = "\n".join(lines[-10:])
    message = f"{stage}: {result.message}" + (f"; its last lines:\n{tail}" if tail else "")
    if result.returncode in NO_RETRY and (cause := child_error(lines)):  # the rank said why: quote that
        message = f"{stage}: {result.message.splitlines()[0]}: {cause}"
    if result.returncode == EXIT_DIVERGED:
        raise StageError(f"{message}\nthe loss diverged: a retry would diverge again at the same step; lower training.learning_rate")
    if result.returncode in NO_RETRY:
        raise StageError(message)
    raise StageFailure(message)


def rank_env(rank: int, size: int, port: int, profile: Profile, base: dict[str, str] | None = None) -> dict[str, str]:
    """The full environment of one rank process."""
    env = dict(os.environ if base is None else base)
    env.update(local_slots(size)[rank].env())
    env.update(gloo_env("127.0.0.1", port, "lo"))
    env[ENV_DEVICE] = profile.device
    if profile.cpu_share is not None:
        env[ENV_SHARE] = str(profile.cpu_share)
        threads = threads_for(profile.cpu_share, list(profile.cpus))
        env[ENV_THREADS] = str(threads)
        env["OMP_NUM_THREADS"] = str(threads)
    # A rank that stalls (a peer hung, not dead) shuts the job down instead of waiting forever.
    env.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "30")
    env.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120")
    # The rendezvous waits this long for a late peer: on a starved 2-core machine a rank's start
    # (TensorFlow's import under a CPU quota) once lagged its peer's by more than 60 s.
    env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "300")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _pump(rank: int | str, stream, tail: collections.deque, output, lock: threading.Lock) -> None:
    """Copy one rank's output to ``output`` as ``[rank i] line`` (a task's as ``[worker:0] line``),
    keeping its last lines in ``tail``."""
    label = f"rank {rank}" if isinstance(rank, int) else rank
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        tail.append(line)
        with lock:
            output.write(f"[{label}] {line}\n")
            output.flush()
    stream.close()


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` meanwhile (only the main thread can handle signals)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda s, f: stop.set())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start_rank(
    command: Sequence[str], rank: int | str, env: dict[str, str], profile: Profile, limiter: CpuLimiter
) -> tuple[subprocess.Popen, bool]:
    """Start one rank in its own process group and place it in its profile's cores and quota.

    Returns the process and whether its quota holds (True when it has no quota to enforce).
    """
    proc = subprocess.Popen(
        list(command),
        env=child_env(env),  # a rank that calls die_with_parent() ends with this launcher
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so we can stop all it started
    )
    if profile.cpu_share is None and not profile.cpus:
        return proc, True
    ok = limiter.limit(proc.pid, f"rank{rank}".replace(":", "-"), profile.cpu_share or float(os.cpu_count() or 1), list(profile.cpus),
                       period_us=int(profile.cpu_period_ms * 1000))
    return proc, ok or profile.cpu_share is None


def failure_message(message: str, failed_rank: int | str | None, tails: dict) -> str:
    """``message``, followed by the failed rank's (or task's) last 15 lines when one failed."""
    if failed_rank is None:
        return message
    tail = "\n".join(f"  {line}" for line in tails[failed_rank][-15:])
    return f"{message}\nlast lines of {'rank ' if isinstance(failed_rank, int) else ''}{failed_rank}:\n{tail}"


def launch(
    command: Sequence[str],
    profiles: Sequence[Profile],
    *,
    job: str | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    output=None,
    on_start=None,
) -> LaunchResult:
    """Run ``command`` as ``len(profiles)`` Horovod ranks; returns when all end or one fails.

    ``output`` receives every rank's lines prefixed with ``[rank i]`` (default: stdout).
    ``on_start(procs, limiter)`` is called once all ranks have started (used by tests to change
    a quota during a run).  Raises nothing for a failed rank: check ``returncode``.
    """
    size = len(profiles)
    if size < 1:
        raise ValueError("need at least one rank")
    server, port = start_rendezvous(local_slots(size), port=0, host="127.0.0.1")
    placed = [(rank, rank_env(rank, size, port, prof, env), prof) for rank, prof in enumerate(profiles)]
    try:
        return _run_tasks(
            command, placed, job=job or f"job-{uuid.uuid4().hex[:8]}", output=output,
            on_start=None if on_start is None else lambda procs, limiter: on_start(list(procs.values()), limiter),
            wait=lambda procs, stop, started, log: _wait(list(procs.values()), stop, timeout_s, started),
        )
    finally:
        server.shutdown()
        server.server_close()


def _run_tasks(command: Sequence[str], placed: Sequence[tuple[int | str, dict[str, str], Profile]], *, job: str,
               output, on_start, wait) -> LaunchResult:
    """Start ``command`` once per ``(name, env, profile)`` (placed in the profile's cores and
    quota, its lines copied to ``output`` as ``[name] line``), call ``on_start(procs, limiter)``,
    and ``wait(procs, stop, started, log)`` for ``(failed name, exit code, message)``, where
    ``log(line)`` writes a launcher line; then stop whatever still runs."""
    output = output or sys.stdout
    limiter = CpuLimiter(job)
    procs: dict[int | str, subprocess.Popen] = {}
    tails = {name: collections.deque(maxlen=TAIL_LINES) for name, _, _ in placed}
    lock, readers, started, enforced, stop = threading.Lock(), [], time.time(), True, threading.Event()

    def log_line(line: str) -> None:
        with lock:
            output.write(f"[launcher] {line}\n")
            output.flush()

    with _stop_on_signals(stop):
        try:
            for name, task_env_, prof in placed:
                p, ok = start_rank(command, name, task_env_, prof, limiter)
                enforced = enforced and ok
                procs[name] = p
                t = threading.Thread(target=_pump, args=(name, p.stdout, tails[name], output, lock), daemon=True)
                t.start()
                readers.append(t)
            if on_start is not None:
                on_start(procs, limiter)
            failed, code, message = wait(procs, stop, started, log_line)
        finally:
            _stop_all(list(procs.values()))
            for t in readers:
                t.join(timeout=5)
            limiter.cleanup()
    tails_out = {name: list(v) for name, v in tails.items()}
    return LaunchResult(
        returncode=code,
        failed_rank=failed,
        tails=tails_out,
        seconds=time.time() - started,
        quota_enforced=enforced and limiter.warning is None,
        message=failure_message(message, failed, tails_out),
    )


def task_env(cluster: dict, role: str, index: int, base: dict[str, str] | None, profile: Profile | None) -> dict[str, str]:
    """The environment of one task of a parameter-server job: its ``TF_CONFIG`` and, for a
    worker, its device type's thread count (as a Horovod rank's)."""
    env = dict(os.environ if base is None else base)
    env[ENV] = tf_config(cluster, role, index)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if profile is not None:
        env[ENV_DEVICE] = profile.device
        if profile.cpu_share is not None:
            threads = threads_for(profile.cpu_share, list(profile.cpus))
            env.update({ENV_SHARE: str(profile.cpu_share), ENV_THREADS: str(threads), "OMP_NUM_THREADS": str(threads)})
    return env


def launch_ps(
    command: Sequence[str],
    cluster: dict,
    workers: Sequence[Profile],
    *,
    job: str | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    output=None,
    on_start=None,
) -> LaunchResult:
    """Run a parameter-server job: every task of ``cluster`` runs ``command`` with its
    ``TF_CONFIG``; worker i is placed as ``workers[i]``.  Returns when the chief ends (its exit
    code is the job's), when a parameter server dies (a failure naming it; the chief cannot go
    on without its variables), or when every worker has died.  A worker that dies is reported and
    the job goes on: the coordinator moves its update to another worker.  ``on_start(tasks,
    limiter)`` gets ``{"chief:0": proc, "worker:1": proc, ...}`` once all have started."""
    order = sorted(tasks(cluster), key=lambda t: t[0] == "chief")  # servers first, the chief last
    placed = [
        (f"{role}:{i}", task_env(cluster, role, i, env, workers[i] if role == "worker" else None),
         workers[i] if role == "worker" else Profile(device=role))
        for role, i in order
    ]
    return _run_tasks(command, placed, job=job or f"ps-{uuid.uuid4().hex[:8]}", output=output, on_start=on_start,
                      wait=lambda procs, stop, started, log: _wait_ps(procs, stop, timeout_s, started, log))


def _wait_ps(procs: dict, stop, timeout_s, started: float, log) -> tuple[str | None, int, str]:
    reported: set[str] = set()
    while True:
        chief = procs["chief:0"].poll()
        if chief is not None:
            return (None, 0, "the chief finished") if chief == 0 else ("chief:0", chief, f"the chief exited with code {chief}")
        for name, p in procs.items():
            code = p.poll()
            if code is None or name in reported:
                continue
            reported.add(name)
            if name.startswith("ps:"):
                time.sleep(2.0)  # let the chief say it too, then stop everything
                return name, EXIT_FAILED, (
                    f"parameter server {name} exited with code {code}: the variables it held are gone; "
                    "stopped every task; the retry resumes from the last checkpoint")
            log(f"worker {name} exited with code {code}; training goes on on the other workers")
        if all(n in reported for n in procs if n.startswith("worker:")):
            return None, EXIT_FAILED, "every worker has exited; stopped the chief and the parameter servers"
        if stop.is_set():
            return None, 143, "launcher was told to stop; stopped every task"
        if timeout_s is not None and time.time() - started > timeout_s:
            return None, 124, f"job exceeded its {timeout_s:.0f}s time limit; stopped every task"
        time.sleep(0.1)


def _wait(procs, stop: threading.Event, timeout_s: float | None, started: float) -> tuple[int | None, int, str]:
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                return rank, code, f"rank {rank} exited with code {code}; stopped the other ranks"
        if all(c == 0 for c in codes):
            return None, 0, "all ranks finished"
        if stop.is_set():
            return None, 143, "launcher was told to stop; stopped every rank"
        if timeout_s is not None and time.time() - started > timeout_s:
            return None, 124, f"job exceeded its {timeout_s:.0f}s time limit; stopped every rank"
        time.sleep(0.1)


def _stop_all(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # started by a stage or a task: stop (and stop the ranks) when it dies
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.launch.local",
        description="Run a Horovod program as N local ranks over Gloo, each with its own device profile.",
        epilog="Everything after -- is the command each rank runs.",
    )
    parser.add_argument("-np", "--num-proc", type=int, required=True, help="number of ranks")
    parser.add_argument("--pool", default=None, help="pool file with the device types (for --profiles)")
    parser.add_argument(
        "--profiles",
        default=None,
        help="comma-separated device type names, one per rank (needs --pool), or cpu-share specs like 'cpu=1:1.0,cpu=0:0.4'",
    )
    parser.add_argument("--job-name", default=None, help="cgroup folder name for this job (default: random)")
    parser.add_argument("--timeout", type=float, default=None, help="stop every rank after this many seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the rank command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    profiles = parse_profiles(args.profiles, args.num_proc, args.pool)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = launch(command, profiles, job=args.job_name, timeout_s=args.timeout)
    if result.returncode != 0:
        print(f"ERROR: {result.message}", file=sys.stderr)
    return result.returncode


def parse_profiles(text: str | None, n: int, pool: str | None) -> list[Profile]:
    """``fast,slow`` (names in ``pool``) or ``cpu=1:1.0,cpu=0:0.4`` (cores:share); default unlimited."""
    if not text:
        return [Profile() for _ in range(n)]
    items = [s.strip() for s in text.split(",")]
    if len(items) != n:
        raise SystemExit(f"--profiles has {len(items)} entries for -np {n}")
    if all(s.startswith("cpu=") for s in items):
        out = []
        for s in items:
            cores, _, share = s.removeprefix("cpu=").partition(":")
            out.append(Profile(device=s, cpus=tuple(int(c) for c in cores.split("+") if c), cpu_share=float(share or 1.0)))
        return out
    if not pool:
        raise SystemExit("--profiles with device names needs --pool")
    if not Path(pool).is_file():
        raise SystemExit(f"--pool {pool}: file not found")
    return profiles_from_pool(pool, items)


if __name__ == "__main__":
    sys.exit(main())
