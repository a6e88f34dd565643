"""The gang's cluster calls against the test cluster (tests/cluster), through the
real ``kubernetes`` client, where a scripted fake could hide what the real client returns."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from hetero.kube.pods import read_pod_log  # noqa: E402

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube


def test_a_rank_log_reads_back_as_its_lines(kube):
    code = "print('first line'); print('second: ü')"
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "log-reader"},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "trainer", "image": "trainer:1", "command": ["python", "-c", code]}]}}
    kube.create_namespaced_pod("default", manifest)
    deadline = time.time() + 20
    while kube.read_namespaced_pod("log-reader", "default").status.phase != "Succeeded":
        assert time.time() < deadline, "the pod did not finish"
        time.sleep(0.2)
    assert read_pod_log(kube, "log-reader", "default", container="trainer").splitlines() == ["first line", "second: ü"]
    assert read_pod_log(kube, "log-reader", "default", tail_lines=1) == "second: ü\n"
