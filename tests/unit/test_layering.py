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
