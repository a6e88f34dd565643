"""pipelines.core.imports: TensorFlow loaded with the cyclic collector paused, the start-up heap
frozen, and every lazy TensorFlow import of ``pipelines`` going through it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# In a fresh interpreter (this one may have loaded TensorFlow already): how many collections ran
# while TensorFlow imported, the collector's state and frozen count after, and a second call.
PROBE = """
import gc, json, sys
from pipelines.core.imports import load_tensorflow
disabled_before = {disabled}
if disabled_before:
    gc.disable()
runs = []
gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(info["generation"]))
tf = load_tensorflow()
during = len(runs)
frozen = gc.get_freeze_count()
again = load_tensorflow()
gc.collect()  # the collector still works afterwards
print(json.dumps({{"name": tf.__name__, "same": again is tf and sys.modules["tensorflow"] is tf,
                   "during": during, "after": len(runs) - during, "enabled": gc.isenabled(),
                   "frozen": frozen, "frozen_again": gc.get_freeze_count()}}))
"""


def probe(disabled: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(disabled=disabled)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.trainer
def test_tensorflow_imports_with_no_collection_and_its_heap_is_frozen():
    pytest.importorskip("tensorflow")
    got = probe(disabled=False)
    assert got["name"] == "tensorflow" and got["same"]
    # A plain `import tensorflow` runs the collector hundreds of times (about 600 on 2.15).
    assert got["during"] == 0
    assert got["enabled"] and got["after"] >= 1  # enabled again: the explicit collection ran
    assert got["frozen"] > 100_000  # TensorFlow's modules, classes and functions
    assert got["frozen_again"] == got["frozen"]  # the second call froze nothing more


@pytest.mark.trainer
def test_a_collector_the_program_disabled_stays_disabled():
    pytest.importorskip("tensorflow")
    got = probe(disabled=True)
    assert got["during"] == 0 and not got["enabled"]


def tensorflow_imports(path: Path) -> list[int]:
    """Lines of ``import tensorflow`` (or ``import tensorflow.<submodule>``) in ``path``.  A
    ``from tensorflow... import`` of a submodule once TensorFlow is loaded costs nothing more, and
    is not counted."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Import)
            and any(a.name == "tensorflow" or a.name.startswith("tensorflow.") for a in node.names)]


def test_every_tensorflow_import_of_pipelines_goes_through_the_loader():
    # The example models import TensorFlow as a user's model does; build_model loads it first.
    allowed = {"pipelines/core/imports.py", "pipelines/models/examples.py"}
    found = {}
    for path in sorted((ROOT / "pipelines").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in allowed and (lines := tensorflow_imports(path)):
            found[rel] = lines
    assert found == {}, f"import TensorFlow through pipelines.core.imports.load_tensorflow(): {found}"
