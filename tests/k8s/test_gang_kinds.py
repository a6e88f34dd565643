"""The gang manager's kinds (hetero.kube.gang_kinds): one manager, configured by who decides the
outcome and what the result is read from, on the fake CoreV1Api (one fake second per poll)."""

from __future__ import annotations

import json

import pytest
from fakes import FakeCoreV1, ListLog, running, terminated
from kubernetes.client import models as m

from hetero.kube.errors import GangError, RankPodFailed
from hetero.kube.gang_kinds import CALIBRATION, HOROVOD, KINDS, PARAMETER_SERVER, PROFILE, kind_named
from hetero.kube.gang_manager import GangManager
from hetero.triggers import GangTrigger
from pipelines.launch.k8s import Identity

IDENTITY = Identity(dag_id="d", run_id="r", task_id="t")
RESULT = {"stage": "train", "steps": 3}


def pod(r: int, **labels: str) -> m.V1Pod:
    """Pod ``r`` of the gang (its ``rank`` label), with the try's labels and ``labels``."""
    return m.V1Pod(metadata=m.V1ObjectMeta(name=f"t-r{r}", labels={**IDENTITY.labels("x"), "rank": str(r), **labels}),
                   spec=m.V1PodSpec(containers=[m.V1Container(name="trainer")]))


def manager(kind, fake: FakeCoreV1, pods: list[m.V1Pod]) -> GangManager:
    return GangManager(fake, IDENTITY, kind, namespace="ml", scheduling_timeout_s=60, image_pull_timeout_s=60,
                       pods=pods, poll_interval_s=1, log=ListLog(), clock=lambda: float(fake.now), sleep=fake.tick)


def ps_pods() -> list[m.V1Pod]:
    """A chief, two workers and a server, labelled as a parameter-server job's pods."""
    return [pod(0, task_type="chief", task_index="0"), pod(1, task_type="worker", task_index="0"),
            pod(2, task_type="worker", task_index="1"), pod(3, task_type="ps", task_index="0")]


def test_every_kind_is_found_by_its_name_as_a_rebuilt_trigger_finds_it():
    assert {kind.name for kind in (HOROVOD, PARAMETER_SERVER, CALIBRATION, PROFILE)} == set(KINDS)
    for name, kind in KINDS.items():
        assert kind_named(name) is kind
        trigger = GangTrigger(namespace="ml", identity={}, pod_names=[], kubernetes_conn_id="c",
                              scheduling_timeout_s=1, image_pull_timeout_s=1, started_at=0.0, kind=name)
        assert GangTrigger(**json.loads(json.dumps(trigger.serialize()[1]))).kind == name


@pytest.mark.parametrize("kind", [HOROVOD, PROFILE])
def test_a_result_line_kind_returns_the_leads_last_json_line(kind):
    fake = FakeCoreV1(default=[running(), terminated(0)])
    fake.logs = {0: ["working", json.dumps(RESULT)], 1: ["rank 1 done"]}
    result = manager(kind, fake, [pod(0), pod(1)]).run()
    assert result == {**RESULT, "launcher_seconds": 1.0}  # no lost workers: every pod had to succeed
    assert fake.pods == {}


def test_the_calibration_kind_returns_what_ran_instead_of_a_result_line():
    fake = FakeCoreV1(default=[running(), terminated(0)])
    fake.logs = {}  # each pod wrote its profile into the run directory; no result line
    result = manager(CALIBRATION, fake, [pod(0), pod(1)]).run()
    assert result == {"namespace": "ml", "service": None, "pods": ["t-r0", "t-r1"], "ranks": 2, "try_number": 1,
                      "reattached": []}


def test_who_decides_one_set_of_pods_every_pod_or_the_chief():
    """The same pods and the same failing worker: the Horovod rules fail the gang on it, the
    parameter-server rules log it and go on until the chief succeeds."""
    scripts = {0: [running(), running(), running(), terminated(0)], 1: [running(), terminated(137)]}
    fake = FakeCoreV1(scripts=scripts, default=[running()])
    fake.logs = {0: [json.dumps(RESULT)], 1: ["worker 0 lost"]}
    with pytest.raises(RankPodFailed, match=r"^worker 0 \(pod t-r1\) failed with exit code 137"):
        manager(HOROVOD, fake, ps_pods()).run()

    fake = FakeCoreV1(scripts=scripts, default=[running()])
    fake.logs = {0: [json.dumps(RESULT)], 1: ["worker 0 lost"]}
    result = manager(PARAMETER_SERVER, fake, ps_pods()).run()
    assert result == {**RESULT, "launcher_seconds": 3.0,
                      "launcher_lost_workers": ["worker 0 (pod t-r1) failed with exit code 137 (Error)"]}
    assert fake.pods == {}


def test_a_resumed_gang_raises_the_error_its_trigger_saw_and_deletes_everything():
    fake = FakeCoreV1(default=[running()])
    gang = manager(HOROVOD, fake, [pod(0)])
    gang.attach_or_create()
    with pytest.raises(GangError, match="disappeared"):
        manager(HOROVOD, fake, []).resume({"status": "error", "error": "GangError", "message": "rank 1 disappeared"})
    assert fake.pods == {}
