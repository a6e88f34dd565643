"""tests/cpu_usage.py, the pytest plugin make test loads: a test's CPU time counts the child
processes it waited for, a test that only waits costs next to nothing, and the session's line is
the one scripts/test-suite.sh reads."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import subprocess, sys, time

def test_busy_child():  # a child process spinning for 0.6 s of CPU
    subprocess.run([sys.executable, "-c",
                    "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"], check=True)

def test_sleeps():
    time.sleep(0.6)
'''


def test_a_test_costs_its_childrens_cpu_and_the_session_line_is_printed(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(TESTS))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_usage",
                           "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    costs = {m[2]: float(m[1]) for m in re.finditer(r"^\s*([\d.]+) CPU-s  \S+::(\w+)$", proc.stdout, re.M)}
    assert set(costs) == {"test_busy_child", "test_sleeps"}, proc.stdout
    assert costs["test_busy_child"] >= 0.55, proc.stdout  # the child's 0.6 s, besides its start
    assert costs["test_sleeps"] < 0.3, proc.stdout
    assert list(costs) == ["test_busy_child", "test_sleeps"]  # the costliest first
    (session,) = re.findall(r"^cpu_usage: (\d+) CPU-s in this session, (\d+) of them within its 2 tests$",
                            proc.stdout, re.M)
    assert int(session[0]) >= int(session[1]) >= 0
