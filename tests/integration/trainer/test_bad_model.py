"""A model that cannot be built fails every program that builds it at once (docs/ARCHITECTURE.md,
"Failure rules"): exit 2, which the Airflow side never retries, one ``ERROR:`` line on standard
error naming ``model.name`` and the cause, and no traceback.

Each program runs as a real subprocess of the trainer environment, as a task or a pod runs it,
with three bad models importable from a temporary folder on ``PYTHONPATH``: a module that cannot
be imported, a build function that raises, and a model whose output is not one logit per class.
The programs: the estimate stage command (which builds the model to describe it), the calibration
command a calibration pod runs (whose profile-bank check builds it first), and the lr_search and
train stage commands, whose ranks (the range test's and the Horovod trainer's) or parameter-server
chief build it under the local launcher.  The profiling sweep, the allreduce probe and the
reference runs take no user model; they share the same ``main`` wrapper (``pipelines.errors``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, write_run

from pipelines.core.stages import calibration_command

PACKAGE = "hetero_bad_models"
BAD_MODELS: dict[str, tuple[str, str]] = {  # case: (the module's source, what the error must say)
    "cannot_import": (
        "import hetero_no_such_dependency  # noqa: F401\n\n\ndef build(input_shape, num_classes):\n    return None\n",
        f"cannot import module '{PACKAGE}.cannot_import': ModuleNotFoundError: No module named "
        f"'hetero_no_such_dependency' at ",
    ),
    "build_raises": (
        "def build(input_shape, num_classes):\n    raise RuntimeError('the layer sizes do not add up')\n",
        "the build function raised RuntimeError: the layer sizes do not add up at ",
    ),
    "wrong_classes": (
        "def build(input_shape, num_classes):\n"
        "    import tensorflow as tf\n\n"
        "    inputs = tf.keras.Input(shape=input_shape)\n"
        "    x = tf.keras.layers.Flatten()(inputs)\n"
        "    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes + 1)(x))\n",
        "the model's output shape (None, 11) does not end in dataset.num_classes=10",
    ),
}
# program: its training settings, the strategy of its plan (none: no plan), and the prefix of the
# ERROR: line its rank or chief prints in the stage's output
PROGRAMS: dict[str, dict] = {
    "estimate": {"training": {}},
    "calibrate": {"training": {}},
    "lr_search": {"training": {"learning_rate": "auto"}, "plan": "horovod", "child": "[rank 0] ERROR: "},
    "train": {"training": {}, "plan": "horovod", "child": "[rank 0] ERROR: "},
    "train_ps": {"training": {"strategy": "parameter_server", "parameter_servers": 1}, "plan": "parameter_server",
                 "child": "[chief:0] ERROR: "},
}
# Each program with one bad model, every model at least once: the three causes are worded by one
# function (pipelines.models, all three unit-tested in tests/unit/models/test_init.py), so what a
# program adds is only the way its error reaches the exit code; the full cross was 15 runs of
# TensorFlow-loading programs for the same 5 paths.
CASES: list[tuple[str, str]] = [("estimate", "cannot_import"), ("calibrate", "build_raises"),
                                ("lr_search", "wrong_classes"), ("train", "build_raises"),
                                ("train_ps", "cannot_import")]
POOL = {"device_types": [{"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.1}]}


def prepare(root: Path, program: str, case: str, pool: Path) -> list[str]:
    """A preloaded run directory whose spec names the bad model ``case``, and the command that
    runs ``program`` on it."""
    how = PROGRAMS[program]
    run = write_run(root / f"{program}-{case}" / "run", rows=64, holdout=8,
                    model={"name": f"{PACKAGE}.{case}:build"}, **how["training"])
    spec = json.loads((run / "spec.json").read_text())
    (run / "spec.json").write_text(json.dumps({**spec, "pool": str(pool)}))
    if how.get("plan"):
        plan = {"global_batch": 64, "strategy": how["plan"],
                "ranks": [{"rank": 0, "device": "fast", "batch": 64, "samples_per_sec": 100.0}]}
        (run / "estimate").mkdir()
        (run / "estimate" / "plan.json").write_text(json.dumps(plan))
    if program == "calibrate":  # the calibration pod's command, bank check included
        return calibration_command(str(run / "spec.json"), "fast", str(run / "profile.json"), 1,
                                   python=sys.executable, unless_banked=True)
    stage = "train" if program == "train_ps" else program
    return [sys.executable, "-m", "pipelines", stage, "--spec", str(run / "spec.json"), "--run-dir", str(run),
            "--pool", str(pool)]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Each program with its bad model (CASES), two at a time (each loads TensorFlow once or twice)."""
    root = tmp_path_factory.mktemp("bad_models")
    models = root / "models"
    (models / PACKAGE).mkdir(parents=True)
    (models / PACKAGE / "__init__.py").write_text("")
    for case, (source, _) in BAD_MODELS.items():
        (models / PACKAGE / f"{case}.py").write_text(source)
    pool = root / "pool.json"
    pool.write_text(json.dumps(POOL))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(models), str(ROOT)]), "TF_CPP_MIN_LOG_LEVEL": "2"}
    jobs = {(program, case): prepare(root, program, case, pool) for program, case in CASES}

    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)

    with ThreadPoolExecutor(max_workers=2) as pool_:
        done = dict(zip(jobs, pool_.map(run, jobs.values()), strict=True))
    return done


@pytest.mark.parametrize(("program", "case"), CASES)
def test_a_bad_model_exits_2_with_one_error_line_naming_it(outcomes, program, case):
    proc = outcomes[program, case]
    shown = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 2, shown  # bad input: the task is not retried
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, shown
    name = f"model.name '{PACKAGE}.{case}:build'"
    assert name in errors[0] and BAD_MODELS[case][1] in errors[0], shown
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, shown
    child = PROGRAMS[program].get("child")
    if child:  # the rank (or chief) that built the model said the same in its own ERROR: line
        own = [line for line in proc.stdout.splitlines() if line.startswith(child)]
        assert len(own) == 1 and name in own[0] and BAD_MODELS[case][1] in own[0], shown
        assert "exited with code 2" in errors[0], shown


def test_every_program_and_every_bad_model_is_covered():
    assert {p for p, _ in CASES} == set(PROGRAMS) and {c for _, c in CASES} == set(BAD_MODELS)
