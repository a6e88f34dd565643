"""tests/cpu_usage.py, the pytest plugin make test loads: a test's CPU time counts the child
processes it waited for, a test that only waits costs next to nothing, a shared fixture is counted
apart from the tests (set-up and teardown), and the session's line is the one scripts/test-suite.sh
reads."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import subprocess, sys, time

import pytest

SPIN = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"


@pytest.fixture(scope="session")
def server():  # a shared fixture: 0.6 s of a child's CPU to set up, 0.6 s more to tear down
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    yield
    subprocess.run([sys.executable, "-c", SPIN], check=True)


def test_busy_child():  # a child process spinning for 0.6 s of CPU
    subprocess.run([sys.executable, "-c", SPIN], check=True)

def test_sleeps(server):
    time.sleep(0.6)
'''


def test_a_test_costs_its_childrens_cpu_and_the_session_line_is_printed(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(TESTS))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_usage",
                           "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    costs = {m[3]: float(m[1]) for m in re.finditer(r"^\s*([\d.]+) CPU-s  (\S+::)?(\w+)", proc.stdout, re.M)}
    assert set(costs) == {"test_busy_child", "test_sleeps", "server"}, proc.stdout
    assert costs["test_busy_child"] >= 0.55, proc.stdout  # the child's 0.6 s, besides its start
    assert costs["test_sleeps"] < 0.3, proc.stdout  # its shared fixture is counted apart ...
    assert costs["server"] >= 1.1, proc.stdout  # ... set-up and teardown (at the session's end)
    assert list(costs) == ["server", "test_busy_child", "test_sleeps"]  # the costliest first
    assert "server (session-scoped fixture)" in proc.stdout
    (session,) = re.findall(r"^cpu_usage: (\d+) CPU-s in this session, (\d+) of them within its tests and shared "
                            r"fixtures$", proc.stdout, re.M)
    assert int(session[0]) >= int(session[1]) >= 1
