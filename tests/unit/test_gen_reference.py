"""The reference pages docs/reference/*.md are generated (scripts/gen_reference.py): a spec field, a
description or a command's option changed without `make docs` fails here.  The generator runs in
its own process, which must not import TensorFlow or Horovod."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_reference.py"
CHECK = (
    "import json, runpy, sys\n"
    f"code = runpy.run_path({str(SCRIPT)!r})['main'](['--check'])\n"
    "print(json.dumps(sorted(m for m in ('tensorflow', 'horovod') if m in sys.modules)))\n"
    "sys.exit(code)\n"
)


@pytest.fixture(scope="module")
def check() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=ROOT)


def test_the_reference_pages_are_up_to_date(check):
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_generator_imports_no_tensorflow_or_horovod(check):
    assert json.loads(check.stdout.splitlines()[-1]) == [], check.stderr
