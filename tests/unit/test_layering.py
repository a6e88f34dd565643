"""The layering rules (docs/ARCHITECTURE.md, "Layout and layering"): pipelines never imports
airflow, no stage package imports another, and nothing Airflow parses imports heavy libraries at
module level, including the pipelines modules the plugins pull in."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_layering", ROOT / "scripts" / "check_layering.py")
check_layering = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_layering)


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in ("pipelines", "dags", "plugins"):
        (root / folder).mkdir(exist_ok=True)
    return root


def test_project_has_no_layering_violations():
    assert check_layering.violations() == []


def test_every_stage_package_exists_with_a_stage_module():
    from pipelines.core.stages import STAGES

    assert tuple(check_layering.STAGE_PACKAGES) == tuple(STAGES)
    for stage in STAGES:
        assert (ROOT / "pipelines" / stage / "stage.py").is_file(), stage


def test_checker_catches_airflow_in_pipelines_and_heavy_imports_in_dags(tmp_path):
    root = write(tmp_path, {
        "pipelines/x.py": "def f():\n    from airflow.sdk import task\n",
        "dags/d.py": "import tensorflow as tf\n",
        "plugins/p.py": "def ok():\n    import numpy\n",
    })
    found = check_layering.violations(root)
    assert any("pipelines/x.py:2: pipelines must not import airflow" in v for v in found)
    assert any("dags/d.py:1: heavy import at module level (tensorflow)" in v for v in found)
    assert not any("plugins/p.py" in v for v in found)


@pytest.mark.parametrize("statement", [
    "from pipelines.train.trainer import Trainer",
    "import pipelines.train.comm",
    "from pipelines.train import comm",
])
def test_a_stage_importing_another_stage_fails_the_check(tmp_path, statement):
    root = write(tmp_path, {
        "pipelines/estimate/stage.py": f"def run():\n    {statement}\n",
        "pipelines/train/trainer.py": "",
        "pipelines/train/comm.py": "",
        "pipelines/sync/balance.py": "",
        "pipelines/train/stage.py": "from pipelines.sync.balance import allocate\nfrom pipelines.train import comm\n",
    })
    found = check_layering.violations(root)
    assert found, "a stage-to-stage import went unnoticed"
    for v in found:  # only the estimate stage's import; train importing itself is fine
        assert v.startswith("pipelines/estimate/stage.py:2: stage 'estimate' must not import stage 'train'"), v
        assert v.endswith("move what both need to a shared module")


def test_a_heavy_import_reached_from_a_plugin_fails_the_check(tmp_path):
    # plugins/hetero/op.py -> pipelines.launch.k8s -> pipelines.util (numpy at module level)
    root = write(tmp_path, {
        "plugins/hetero/__init__.py": "",
        "plugins/hetero/op.py": "from pipelines.launch import k8s\n",
        "pipelines/__init__.py": "",
        "pipelines/launch/__init__.py": "",
        "pipelines/launch/k8s.py": "import json\nfrom pipelines.util import helper\n",
        "pipelines/util.py": "import numpy as np\n\ndef helper():\n    return np\n",
        "pipelines/heavy_but_unused.py": "import tensorflow\n",
    })
    found = check_layering.violations(root)
    assert len(found) == 1, found
    assert found[0].startswith("pipelines/util.py:1: heavy import at module level (numpy)")
    assert "imported by pipelines/launch/k8s.py" in found[0]


def test_the_plugins_parse_time_closure_covers_the_kubernetes_manifests():
    files = {p.relative_to(ROOT).as_posix() for p in check_layering.parse_time_files(ROOT)}
    for rel in ("pipelines/launch/k8s/__init__.py", "pipelines/spec/__init__.py", "pipelines/stores/rundir.py",
                "pipelines/core/stages.py", "plugins/hetero/kube/gang_manager.py"):
        assert rel in files, rel
    assert "pipelines/train/trainer.py" not in files


def test_an_import_circle_fails_the_check_even_through_a_function_level_import(tmp_path):
    root = write(tmp_path, {
        "pipelines/__init__.py": "",
        "pipelines/train/__init__.py": "",
        "pipelines/train/a.py": "from pipelines.train import b\n",
        "pipelines/train/b.py": "def later():\n    from pipelines.train.c import x\n",
        "pipelines/train/c.py": "import pipelines.train.a\nx = 1\n",
        "pipelines/train/d.py": "from pipelines.train.a import b\n",  # into the circle, not part of it
    })
    found = check_layering.violations(root)
    assert found == ["pipelines/train/a.py: import circle: pipelines/train/a.py -> pipelines/train/b.py -> "
                     "pipelines/train/c.py -> pipelines/train/a.py; move what both need to a module that "
                     "imports neither"]


def test_a_package_re_exporting_its_submodules_is_no_circle(tmp_path):
    root = write(tmp_path, {
        "pipelines/__init__.py": "",
        "pipelines/spec/__init__.py": "from pipelines.spec.job import Job\nfrom pipelines.spec.pool import Pool\n",
        "pipelines/spec/job.py": "from pipelines.spec.pool import Pool\nclass Job: pass\n",
        "pipelines/spec/pool.py": "class Pool: pass\n",
    })
    assert check_layering.violations(root) == []


def test_a_file_over_the_line_limit_fails_the_check(tmp_path):
    limit = check_layering.MAX_LINES
    root = write(tmp_path, {
        "plugins/hetero/long.py": "x = 1\n" * (limit + 1),
        "pipelines/short.py": "x = 1\n" * limit,
    })
    assert check_layering.violations(root) == [
        f"plugins/hetero/long.py: {limit + 1} lines, more than {limit}; split it by what it holds"]
