"""The TF_CONFIG of every task of a parameter-server job (pipelines.launch.tfconfig)."""

from __future__ import annotations

import pytest

from pipelines.launch.tfconfig import cluster_spec, tf_config

CLUSTER = cluster_spec("h:1", ["h:2", "h:3"], ["h:4"])


@pytest.mark.parametrize(("role", "index", "words"), [("boss", 0, "unknown task type"), ("worker", 2, "no task worker:2")])
def test_a_task_outside_the_cluster_is_refused(role, index, words):
    with pytest.raises(ValueError, match=words):
        tf_config(CLUSTER, role, index)


def test_a_cluster_needs_workers_and_servers():
    with pytest.raises(ValueError, match="at least one worker"):
        cluster_spec("h:1", [], ["h:4"])
    with pytest.raises(ValueError, match="at least one parameter server"):
        cluster_spec("h:1", ["h:2"], [])
