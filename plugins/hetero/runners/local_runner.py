"""The local launcher's runner: a stage (or any command of the trainer environment) as a
subprocess of the task.

The command is exactly what a pod runs (:func:`pipelines.core.stages.stage_command`) with the
trainer environment's Python, the pool and its profiles carried inline
(:func:`hetero.task_context.carried_inputs`).  Its output is streamed line by line into the task
log, except the trainer's machine-readable progress lines, whose newest is written for people at
most every ``progress.interval_s`` seconds (:class:`pipelines.core.progress.ProgressLog`); a
non-zero exit fails the task with the stage's own ``ERROR:`` lines; the last line (a JSON
document: the command carries ``--json``, so it never depends on a terminal) becomes the task's XCom.  If the task is killed, the command's whole process group is
stopped.  :class:`LocalCommand` does the same for any command of the trainer environment (the
profiling sweep's, ``hetero.profiling``).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from hetero.task_context import PROJECT_ROOT, carried_inputs, run_dir_for, stage_context
from pipelines.core.progress import ProgressLog
from pipelines.core.stages import StageContext, last_json_object, stage_command
from pipelines.errors import EXIT_BAD_INPUT
from pipelines.launch.lifetime import child_env
from pipelines.spec import JobSpec

__all__ = ["LocalCommand", "LocalRunner", "LocalStage", "StageProcessError", "command_result", "stage_result",
           "trainer_python"]

log = logging.getLogger(__name__)


class StageProcessError(AirflowException):
    """A stage's process (subprocess or pod) could not start, exited non-zero or printed no JSON
    result; the message carries its last or error lines.  (Not :class:`pipelines.errors.StageError`,
    which a stage raises inside that process.)"""


def trainer_python() -> str:
    """The trainer environment's interpreter: $HETERO_TRAINER_PYTHON or <project>/.venv-trainer."""
    explicit = os.environ.get("HETERO_TRAINER_PYTHON")
    if explicit:
        return explicit
    candidate = PROJECT_ROOT / ".venv-trainer" / "bin" / "python"
    if candidate.exists():
        return str(candidate)
    raise StageProcessError(
        f"no trainer environment: {candidate} does not exist and HETERO_TRAINER_PYTHON is not set; run 'make setup'"
    )


def stage_result(lines: Sequence[str], stage: str, where: str) -> dict:
    """The stage's JSON result (its last JSON object line); the error quotes the last lines otherwise."""
    return command_result(lines, f"stage {stage!r}", where)


def command_result(lines: Sequence[str], what: str, where: str = "the output") -> dict:
    """The last JSON object line of a command's output (``what`` names the command in the error,
    which quotes the last lines when there is none)."""
    result = last_json_object(lines)
    if result is None:
        tail = "\n".join(list(lines)[-15:])
        raise StageProcessError(f"{what}: {where} has no JSON result line; last lines:\n{tail}")
    return result


class LocalCommand:
    """A command run as a subprocess in the trainer environment, its output streamed into the task
    log and its last JSON line returned (a stage's, or the profiling sweep's); :meth:`kill` stops it
    and everything it started.  Exit 2 (bad input) fails the task without retries; any other
    failure raises :class:`StageProcessError`, which Airflow retries.  ``what`` names it in errors;
    a progress line of the trainer's is written for people at most every ``progress_interval_s``."""

    def __init__(self, what: str, *, cwd: str | None = None, progress_interval_s: float = 60.0):
        self.what, self.cwd, self.progress_interval_s = what, cwd, progress_interval_s
        self.proc: subprocess.Popen | None = None

    def run_command(self, cmd: Sequence[str]) -> dict:
        """Run ``cmd`` (its first word the trainer environment's python) and return its JSON result."""
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.proc = proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,  # not the task's standard input (Airflow's supervisor socket)
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env(env),  # the command ends, and stops its ranks, when this task process dies
            cwd=self.cwd or str(PROJECT_ROOT),
            start_new_session=True,  # its own process group: kill() reaches the ranks too
        )
        tail: collections.deque[str] = collections.deque(maxlen=40)
        errors: list[str] = []
        progress = ProgressLog(self.progress_interval_s, lambda text: log.info("%s", text))
        try:
            for raw in iter(proc.stdout.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                if progress.take(line):  # rank 0's machine-readable progress: one line for people now and then
                    progress.report()
                    continue
                tail.append(line)
                if line.startswith("ERROR:") or errors:
                    errors.append(line)
                log.info("%s", line)
            code = proc.wait()
        finally:
            # Killed task, timeout or any exception: stop the command and everything it started.
            self.kill()
        if code != 0:
            detail = "\n".join(errors or list(tail)[-15:])
            message = f"{self.what} failed with exit code {code}:\n{detail}"
            if code == EXIT_BAD_INPUT:  # bad input or a diverged loss: a retry would fail the same way
                raise AirflowFailException(message + "\n(not retried: fix the input)")
            raise StageProcessError(message)
        return command_result(tail, self.what)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _kill_group(self.proc)


class LocalStage(LocalCommand):
    """One stage run as a subprocess; :meth:`kill` stops it and everything it started."""

    def __init__(self, stage: str, spec: JobSpec, ctx: StageContext, *, python: str | None = None, cwd: str | None = None):
        super().__init__(f"stage {stage!r}", cwd=cwd, progress_interval_s=spec.progress.interval_s)
        self.stage, self.spec, self.ctx = stage, spec, ctx
        self.python = python

    def run(self) -> dict:
        """Run the stage in the trainer environment and return its JSON result."""
        run_dir = run_dir_for(self.spec, self.ctx)
        python = self.python or trainer_python()
        inputs = carried_inputs(self.spec)
        cmd = stage_command(self.stage, self.spec.to_json(), str(run_dir), self.ctx, python, inputs=inputs)
        log.info("running stage %s in %s", self.stage, run_dir)
        return self.run_command(cmd)


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass




class LocalRunner:
    """The local launcher: ``stage`` of ``spec`` as a subprocess of the task (:class:`LocalStage`);
    it never defers."""

    def __init__(self, stage: str, spec: JobSpec):
        self.stage, self.spec = stage, spec
        self.process: LocalCommand | None = None

    def start(self, context: Any) -> dict:
        self.process = process = LocalStage(self.stage, self.spec, stage_context(context))
        return process.run()

    def resume(self, context: Any, event: dict) -> dict:
        raise StageProcessError(f"{self.process_name()} runs on the task's machine and never defers")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()  # the command's whole process group

    def process_name(self) -> str:
        return f"stage {self.stage!r}"


class LocalCommandRunner(LocalRunner):
    """The local launcher for any command of the trainer environment (``what`` names it in errors),
    run while ``hold()`` is held (the profiling sweeps' machine-wide lock)."""

    def __init__(self, what: str, command: Sequence[str], hold: Callable[[], AbstractContextManager] = nullcontext):
        self.what, self.command, self.hold = what, list(command), hold
        self.process = None

    def start(self, context: Any) -> dict:
        self.process = process = LocalCommand(self.what)
        with self.hold():
            return process.run_command(self.command)

    def process_name(self) -> str:
        return self.what

