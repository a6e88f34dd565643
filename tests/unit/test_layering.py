"""pipelines never imports airflow; dags/ and plugins/ keep heavy imports inside functions."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_layering", ROOT / "scripts" / "check_layering.py")
check_layering = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_layering)


def test_project_has_no_layering_violations():
    assert check_layering.violations() == []


def test_checker_catches_violations(tmp_path):
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "dags").mkdir()
    (tmp_path / "plugins").mkdir()
    (tmp_path / "pipelines" / "x.py").write_text("def f():\n    from airflow.sdk import task\n")
    (tmp_path / "dags" / "d.py").write_text("import tensorflow as tf\n")
    (tmp_path / "plugins" / "p.py").write_text("def ok():\n    import numpy\n")
    found = check_layering.violations(tmp_path)
    assert any("pipelines/x.py:2: pipelines must not import airflow" in v for v in found)
    assert any("dags/d.py:1: heavy import at module level (tensorflow)" in v for v in found)
    assert not any("plugins/p.py" in v for v in found)


def test_no_module_level_imports_of_heavy_libraries_in_light_pipelines_modules():
    # Modules the Airflow environment imports must not need the trainer's libraries.
    for rel in ("pipelines/spec/__init__.py", "pipelines/rundir.py", "pipelines/stages.py", "pipelines/launch/rendezvous.py"):
        tree = ast.parse((ROOT / rel).read_text())
        mods = [m for _, m in check_layering.imported_modules(tree, module_level_only=True)]
        assert not {m.split(".")[0] for m in mods} & check_layering.HEAVY, rel
