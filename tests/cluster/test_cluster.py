"""The test cluster behaves as a cluster to the real ``kubernetes`` client and to the provider's
``KubernetesPodOperator``: pods run as processes, with their environment, volumes, names and limits."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
import time
import urllib.request
from pathlib import Path

import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from processes import alive
from testcluster import TestCluster

from pipelines.launch.ports import free_ports

pytest_plugins = ["testcluster.fixtures"]  # cluster, cluster_nodes, kube, kube_conn, task_context
NS = "default"
TS_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z) (.*)$")


def wait_for(check, timeout: float = 15.0, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pod(name: str, code: str, *, restart: str = "Never", pod_spec: dict | None = None,
        volumes: list | None = None, **container) -> dict:
    """A pod running ``python -u -c code`` in one container named ``main``."""
    main = {"name": "main", "image": "trainer:1", "command": ["python", "-u", "-c", code], **container}
    spec = {"restartPolicy": restart, "containers": [main], **({"volumes": volumes} if volumes else {}), **(pod_spec or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def finished(kube, name: str, timeout: float = 20.0):
    return wait_for(lambda: (p := kube.read_namespaced_pod(name, NS)).status.phase in ("Succeeded", "Failed") and p,
                    timeout, f"pod {name} to finish")


def log_text(kube, name: str, **kwargs) -> str:
    # _preload_content=False, as the provider reads: client 36.0.x returns str(bytes) otherwise (issue #2596)
    return kube.read_namespaced_pod_log(name, NS, _preload_content=False, **kwargs).data.decode()


def run(kube, manifest: dict) -> tuple:
    kube.create_namespaced_pod(NS, manifest)
    done = finished(kube, manifest["metadata"]["name"])
    return done, log_text(kube, manifest["metadata"]["name"])


def test_pod_goes_pending_running_succeeded_and_its_logs_stream(kube, cluster):
    code = "import time; print('early'); time.sleep(2.2); print('late'); time.sleep(0.3)"
    phases, waiting = [], []
    w = watch.Watch()
    # watch from before the create: a watch begun after it may start with the pod already running
    # (a list's current state, as a real API server gives it), and it did on a fast machine
    since = kube.list_namespaced_pod(NS, field_selector="metadata.name=hello").metadata.resource_version
    kube.create_namespaced_pod(NS, pod("hello", code))
    followed = []
    for event in w.stream(kube.list_namespaced_pod, NS, field_selector="metadata.name=hello", timeout_seconds=20,
                          resource_version=since):
        p = event["object"]
        if not phases or phases[-1] != p.status.phase:
            phases.append(p.status.phase)
        for cs in p.status.container_statuses or []:
            if cs.state.waiting:
                waiting.append(cs.state.waiting.reason)
        if p.status.phase == "Running" and not followed:  # follow while it runs: lines arrive as printed
            stream = kube.read_namespaced_pod_log("hello", NS, follow=True, timestamps=True, _preload_content=False)
            followed = b"".join(stream.stream()).decode().splitlines()
        if p.status.phase == "Succeeded":
            w.stop()
    assert phases == ["Pending", "Running", "Succeeded"]
    assert "ContainerCreating" in waiting
    assert [TS_LINE.match(line)[2] for line in followed] == ["early", "late"]

    done = kube.read_namespaced_pod("hello", NS)
    term = done.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (0, "Completed")
    assert term.started_at <= term.finished_at and done.spec.node_name in ("cpu-node", "gpu-node")
    assert done.status.pod_ip == "127.0.0.1"
    assert log_text(kube, "hello") == "early\nlate\n"
    assert log_text(kube, "hello", tail_lines=1) == "late\n"
    late = dt.datetime.fromisoformat(TS_LINE.match(followed[1])[1][:26].rstrip("Z") + "+00:00")
    since = math.floor(time.time() - late.timestamp()) + 2  # 1-2 s before 'late': after 'early'
    assert log_text(kube, "hello", since_seconds=since) == "late\n"
    since_time = late.strftime("%Y-%m-%dT%H:%M:%SZ")  # sinceTime (whole seconds) is not in the client
    with urllib.request.urlopen(f"{cluster.url}/api/v1/namespaces/{NS}/pods/hello/log?sinceTime={since_time}") as r:
        assert r.read() == b"late\n"
    events = [e.reason for e in kube.list_namespaced_event(NS, field_selector="involvedObject.name=hello").items]
    assert events[0] == "Scheduled" and "Started" in events


def test_a_failing_command_fails_the_pod_with_its_exit_code(kube):
    done, text = run(kube, pod("boom", "import sys; print('boom'); sys.exit(3)",
                               terminationMessagePolicy="FallbackToLogsOnError"))
    term = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Failed"
    assert (term.exit_code, term.reason, term.message) == (3, "Error", "boom\n")
    assert text == "boom\n"


def test_on_failure_restarts_the_container_and_keeps_the_previous_log(kube):
    code = ("import os, sys; first = not os.path.exists('/state/ran'); open('/state/ran', 'w').close();"
            "print('first' if first else 'second'); sys.exit(1 if first else 0)")
    manifest = pod("retry", code, restart="OnFailure", volumes=[{"name": "state", "emptyDir": {}}],
                   volumeMounts=[{"name": "state", "mountPath": "/state"}])
    done, text = run(kube, manifest)
    cs = done.status.container_statuses[0]
    assert (done.status.phase, cs.restart_count, text) == ("Succeeded", 1, "second\n")
    assert (cs.last_state.terminated.exit_code, cs.last_state.terminated.reason) == (1, "Error")
    assert log_text(kube, "retry", previous=True) == "first\n"  # the emptyDir outlived the first container


def test_env_from_a_secret_reaches_the_process_and_waits_for_a_missing_secret(kube):
    code = "import os, json; print(json.dumps({k: os.environ.get(k) for k in ['USER_KEY', 'TOKEN', 'POD', 'MIXED', 'RANK']}))"
    manifest = pod("env", code, envFrom=[{"secretRef": {"name": "s3-creds"}}], env=[
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "TOKEN"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MIXED", "value": "$(USER_KEY)-$(POD)"},
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rank']"}}}])
    manifest["metadata"]["labels"] = {"rank": "2"}
    kube.create_namespaced_pod(NS, manifest)
    waiting = wait_for(lambda: [cs.state.waiting for cs in kube.read_namespaced_pod("env", NS).status.container_statuses or []
                                if cs.state.waiting and cs.state.waiting.reason == "CreateContainerConfigError"])
    assert waiting[0].message == 'secret "s3-creds" not found'
    assert kube.read_namespaced_pod("env", NS).status.phase == "Pending"
    kube.create_namespaced_secret(NS, {"metadata": {"name": "s3-creds"}, "stringData": {"USER_KEY": "abc"},
                                       "data": {"TOKEN": base64.b64encode(b"t0k").decode()}})
    stored = kube.read_namespaced_secret("s3-creds", NS)
    assert base64.b64decode(stored.data["USER_KEY"]) == b"abc" and stored.string_data is None
    assert finished(kube, "env").status.phase == "Succeeded"
    assert json.loads(log_text(kube, "env")) == {"USER_KEY": "abc", "TOKEN": "t0k", "POD": "env",
                                                 "MIXED": "abc-env", "RANK": "2"}
    assert kube.delete_namespaced_secret("s3-creds", NS).status == "Success"
    assert [s.metadata.name for s in kube.list_namespaced_secret(NS).items if s.metadata.name == "s3-creds"] == []


def test_claim_empty_dir_and_secret_volumes_are_real_folders_at_their_mount_paths(kube, cluster):
    kube.create_namespaced_secret(NS, {"metadata": {"name": "vol-secret"}, "stringData": {"token.txt": "s3cr3t"}})
    volumes = [{"name": "artifacts", "persistentVolumeClaim": {"claimName": "hetero-artifacts"}},
               {"name": "scratch", "emptyDir": {}}, {"name": "creds", "secret": {"secretName": "vol-secret"}}]
    mounts = [{"name": "artifacts", "mountPath": "/mnt/artifacts"}, {"name": "scratch", "mountPath": "/tmp"},
              {"name": "creds", "mountPath": "/mnt/creds", "readOnly": True}]
    write = ("import os; open('/mnt/artifacts/from-a', 'w').write('a'); open('/tmp/mine', 'w').write('x');"
             "print(os.getcwd(), sorted(os.listdir('/tmp')))")
    read = ("import os; print(open('/mnt/artifacts/from-a').read(), os.listdir('/tmp'),"
            "open('/mnt/creds/token.txt').read())")
    a, text_a = run(kube, pod("writer", write, volumes=volumes, volumeMounts=mounts[:2], workingDir="/tmp/work"))
    b, text_b = run(kube, pod("reader", read, volumes=volumes, volumeMounts=mounts))
    assert (a.status.phase, b.status.phase) == ("Succeeded", "Succeeded"), (text_a, text_b)
    # The image's own folders stay visible where /tmp covers them (a checkout under /tmp).
    image = {Path(p).parts[2] for p in cluster.kubelet.image_paths if Path(p).parts[1:2] == ("tmp",)}
    assert text_a == f"/tmp/work {sorted({'mine', 'work'} | image)}\n"  # /tmp is the pod's own emptyDir; workingDir was made there
    assert text_b == f"a {sorted(image)} s3cr3t\n"  # the claim is shared; the second pod's emptyDir is fresh
    assert (cluster.claim_path("hetero-artifacts") / "from-a").read_text() == "a"
    assert not Path("/mnt/artifacts/from-a").exists() and not Path("/tmp/mine").exists()  # private mounts


def test_service_names_resolve_and_a_pod_reaches_another_through_them(kube, free_port):
    kube.create_namespaced_service(NS, {"metadata": {"name": "rdzv", "labels": {"job": "j1"}}, "spec": {
        "clusterIP": "None", "selector": {"job": "j1"}, "ports": [{"port": free_port}]}})
    kube.create_namespaced_service(NS, {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})
    server = ("import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
              f"s.bind(('0.0.0.0', {free_port})); s.listen(); c, _ = s.accept();"
              "c.sendall(c.recv(16) + b' from ' + socket.gethostname().encode()); c.close()")
    client = ("import socket, time\n"
              "names = ['rdzv', 'rdzv.default.svc.cluster.local', 'web.default.svc', 'rank-0.rdzv.default.svc.cluster.local']\n"
              "print(sorted({socket.gethostbyname(n) for n in names}))\n"
              "for _ in range(100):\n"
              f"    try: c = socket.create_connection(('rdzv', {free_port})); break\n"
              "    except OSError: time.sleep(0.1)\n"
              "c.sendall(b'ping'); print(c.recv(64).decode())")
    srv = pod("rank-0-pod", server, pod_spec={"hostname": "rank-0", "subdomain": "rdzv"})
    srv["metadata"]["labels"] = {"job": "j1"}
    kube.create_namespaced_pod(NS, srv)
    _, text = run(kube, pod("rank-1-pod", client))
    assert text == "['127.0.0.1']\nping from rank-0\n"
    assert finished(kube, "rank-0-pod").status.phase == "Succeeded"
    svc = kube.read_namespaced_service("web", NS)
    assert svc.spec.ports[0].target_port == 80 and svc.spec.cluster_ip.startswith("10.96.")
    assert [s.metadata.name for s in kube.list_namespaced_service(NS, label_selector="job=j1").items] == ["rdzv"]
    kube.delete_namespaced_service("web", NS)
    with pytest.raises(ApiException) as e:
        kube.read_namespaced_service("web", NS)
    assert e.value.status == 404


@pytest.fixture
def free_port() -> int:
    return free_ports(1)[0]  # below the ephemeral range: the pod binds it later (pipelines.launch.ports)


def gpu_pod(name: str, gpus: int, **spec) -> dict:
    manifest = pod(name, "print('on gpu')", resources={"limits": {"nvidia.com/gpu": str(gpus)}},
                   pod_spec={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], **spec})
    return manifest


def failed_scheduling(kube, name: str) -> str:
    return wait_for(lambda: [e.message for e in kube.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={name},reason=FailedScheduling").items], what="FailedScheduling")[-1]


def test_pods_that_fit_no_node_stay_pending_with_the_schedulers_message(kube, cluster, cluster_nodes):
    kube.create_namespaced_pod(NS, gpu_pod("two-gpus", 2))
    assert failed_scheduling(kube, "two-gpus") == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    selector = pod("wrong-pool", "pass", pod_spec={"nodeSelector": {"accelerator": "nvidia-a100"}})
    kube.create_namespaced_pod(NS, selector)
    assert failed_scheduling(kube, "wrong-pool") == ("0/2 nodes are available: 1 node(s) didn't match Pod's node "
                                                     "affinity/selector, 1 node(s) had untolerated taint "
                                                     "{nvidia.com/gpu: present}.")
    p = kube.read_namespaced_pod("two-gpus", NS)
    cond = next(c for c in p.status.conditions if c.type == "PodScheduled")
    assert (p.status.phase, cond.status, cond.reason, p.spec.node_name) == ("Pending", "False", "Unschedulable", None)
    assert p.spec.containers[0].resources.requests == {"nvidia.com/gpu": "2"}  # defaulted from limits
    done, text = run(kube, gpu_pod("one-gpu", 1))
    assert (done.spec.node_name, done.status.phase, text) == ("gpu-node", "Succeeded", "on gpu\n")
    time.sleep(0.3)
    assert kube.read_namespaced_pod("two-gpus", NS).status.phase == "Pending"
    kube.delete_namespaced_pod("wrong-pool", NS)  # unscheduled pods go at once
    assert [p.metadata.name for p in kube.list_namespaced_pod(NS, field_selector="status.phase=Pending").items] == ["two-gpus"]
    try:  # a node that fits arrives: the pending pod is scheduled on it
        big = {"name": "big-gpu-node", "capacity": {"nvidia.com/gpu": "4"}, "taints": cluster_nodes[1]["taints"]}
        cluster.set_nodes(cluster_nodes + [big])
        assert (finished(kube, "two-gpus").spec.node_name) == "big-gpu-node"
        assert [n.metadata.name for n in kube.list_node(label_selector="kubernetes.io/hostname=big-gpu-node").items] == [
            "big-gpu-node"]
    finally:
        cluster.set_nodes(cluster_nodes)


def api_error(call, *args) -> tuple[int, dict]:
    with pytest.raises(ApiException) as e:
        call(*args)
    return e.value.status, json.loads(e.value.body)


def test_invalid_and_duplicate_objects_are_refused_as_a_real_server_does(kube):
    bad = pod("bad-field", "pass")
    bad["spec"]["containers"][0]["imagePullPolicy"] = 5
    code, body = api_error(kube.create_namespaced_pod, NS, bad)
    assert (code, body["reason"], body["details"]["causes"][0]["field"]) == (
        422, "Invalid", "spec.containers[0].imagePullPolicy")
    no_image = pod("Bad_Name", "pass")
    del no_image["spec"]["containers"][0]["image"]
    no_image["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}
    code, body = api_error(kube.create_namespaced_pod, NS, no_image)
    fields = {c["field"] for c in body["details"]["causes"]}
    assert code == 422 and fields == {"metadata.name", "spec.containers[0].image", "spec.containers[0].resources.requests[cpu]"}
    assert body["message"].startswith('Pod "Bad_Name" is invalid: [')
    lots = pod("lots", "pass", resources={"limits": {"cpu": "lots"}})
    code, body = api_error(kube.create_namespaced_pod, NS, lots)
    assert (code, body["reason"]) == (400, "BadRequest") and "quantities must match" in body["message"]
    unknown = pod("unknown-field", "pass")
    unknown["spec"]["containers"][0]["bogus"] = 1
    code, body = api_error(kube.create_namespaced_pod, NS, unknown)
    assert code == 422 and "'bogus' was unexpected" in body["message"]
    code, body = api_error(kube.create_namespaced_secret, NS, {"metadata": {"name": "bad-b64"}, "data": {"k": "%%"}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "data[k]"

    kube.create_namespaced_pod(NS, pod("twice", "pass"))
    code, body = api_error(kube.create_namespaced_pod, NS, pod("twice", "pass"))
    assert (code, body["reason"], body["message"]) == (409, "AlreadyExists", 'pods "twice" already exists')
    code, body = api_error(kube.read_namespaced_pod, "nowhere", NS)
    assert (code, body["reason"], body["message"]) == (404, "NotFound", 'pods "nowhere" not found')
    finished(kube, "twice")
    patched = kube.patch_namespaced_pod("twice", NS, {"metadata": {"labels": {"already_checked": "True"}}})
    assert patched.metadata.labels == {"already_checked": "True"}  # a strategic-merge patch (the client's choice)
    patched = kube.patch_namespaced_pod("twice", NS, {"metadata": {"annotations": {"a": "1"}, "labels": {"x": "y"}}},
                                        _content_type="application/merge-patch+json")
    assert (patched.metadata.annotations, patched.metadata.labels) == ({"a": "1"}, {"already_checked": "True", "x": "y"})
    assert [p.metadata.name for p in kube.list_namespaced_pod(NS, label_selector="already_checked=True,!airflow-worker").items] == ["twice"]
    code, _ = api_error(kube.patch_namespaced_pod, "twice", NS, {"spec": {"restartPolicy": "Always"}})
    assert code == 422


def test_deleting_a_running_pod_kills_its_process_group_after_the_grace_period(kube):
    code = ("import os, signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "child = subprocess.Popen(['sleep', '300']); print(os.getpid(), child.pid); time.sleep(300)")
    kube.create_namespaced_pod(NS, pod("sleeper", code))
    pids = wait_for(lambda: kube.read_namespaced_pod("sleeper", NS).status.phase == "Running"
                    and log_text(kube, "sleeper"), what="the pids").split()
    pids = [int(p) for p in pids]
    assert all(alive(p) for p in pids)
    start = time.time()
    kube.delete_namespaced_pod("sleeper", NS, grace_period_seconds=1)
    assert kube.read_namespaced_pod("sleeper", NS).metadata.deletion_timestamp is not None
    assert all(alive(p) for p in pids)  # SIGTERM is ignored: the grace period runs out first
    wait_for(lambda: not kube.list_namespaced_pod(NS, field_selector="metadata.name=sleeper").items, what="deletion")
    assert time.time() - start >= 1.0
    assert not any(alive(p) for p in pids)


def test_the_cpu_limit_is_the_pod_processs_cfs_quota(kube, cluster):
    if not (cluster.kubelet.limiter and cluster.kubelet.limiter.available):
        pytest.skip("no writable cpu cgroup controller here")
    code = "from pipelines.launch.cgroups import cpu_quota_cores; print(cpu_quota_cores())"
    done, text = run(kube, pod("limited", code, resources={"limits": {"cpu": "250m"}}))
    assert done.spec.containers[0].resources.requests == {"cpu": "250m"} and done.status.qos_class == "Burstable"
    assert text == "0.25\n"
    _, text = run(kube, pod("unlimited", code))
    assert text == "None\n"


def test_a_cpu_limit_it_cannot_enforce_is_reported_not_hidden(tmp_path):
    """Without a writable cpu cgroup controller the pod still runs (unthrottled), and the cluster
    says so: the limit is listed and ``cpu_limits_enforced`` is False, for tests to skip on."""
    no_cgroups = tmp_path / "no-cgroups"
    no_cgroups.mkdir()
    with TestCluster(tmp_path / "cluster", cgroup_root=no_cgroups) as c:
        kube = c.client()
        code = "from pipelines.launch.cgroups import cpu_quota_cores; print(cpu_quota_cores())"
        done, text = run(kube, pod("limited", code, resources={"limits": {"cpu": "500m"}}))
        assert done.status.phase == "Succeeded", text
        assert not c.cpu_limits_enforced
        assert str(no_cgroups) in c.cpu_limits_note and "0.5 CPU" in c.cpu_limits_note
        assert len(c.kubelet.unenforced_cpu_limits) == 1


def test_an_enforced_limit_says_so(kube, cluster):
    if not (cluster.kubelet.limiter and cluster.kubelet.limiter.available):
        pytest.skip("no writable cpu cgroup controller here")
    done, text = run(kube, pod("limited-2", "print('ok')", resources={"limits": {"cpu": "300m"}}))
    assert done.status.phase == "Succeeded", text
    assert cluster.cpu_limits_enforced and cluster.cpu_limits_note == "CPU limits are enforced as CFS quotas"


def test_pods_python_is_the_trainer_environment_with_this_checkout_on_its_path(kube, cluster):
    if ".venv-trainer" not in cluster.python:
        pytest.skip("no trainer environment")
    code = "import sys, pyarrow, pipelines; print(sys.prefix); print(pipelines.__file__)"
    done, text = run(kube, pod("trainer-env", code))
    assert done.status.phase == "Succeeded", text
    prefix, package = text.split()
    assert Path(prefix).resolve() == Path(cluster.python).parents[1].resolve()  # the venv, not its base
    assert Path(package).is_relative_to(cluster.repo_root)


def test_stopping_the_cluster_leaves_no_process_and_no_cgroup(tmp_path):
    cluster = TestCluster(tmp_path).start()
    kube = cluster.client()
    code = "import os, subprocess, time; c = subprocess.Popen(['sleep', '300']); print(os.getpid(), c.pid); time.sleep(300)"
    kube.create_namespaced_pod(NS, pod("lingering", code, resources={"limits": {"cpu": "1"}}))
    pids = [int(p) for p in wait_for(lambda: kube.read_namespaced_pod("lingering", NS).status.phase == "Running"
                                     and log_text(kube, "lingering"), what="the pids").split()]
    limiter = cluster.kubelet.limiter
    cluster.stop()
    assert not any(alive(p) for p in pids) and cluster.leftover_pids() == []
    if limiter.available:
        assert limiter.job_dir.parent.is_dir() and not limiter.job_dir.exists()


def kpo(name: str, code: str, conn_id: str):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return KubernetesPodOperator(
        task_id=name, name=name, namespace=NS, image="trainer:1", cmds=["python", "-u", "-c", code],
        kubernetes_conn_id=conn_id, get_logs=True, do_xcom_push=False, deferrable=False,
        startup_check_interval_seconds=1, log_events_on_failure=True)


def test_kubernetes_pod_operator_runs_a_pod_to_completion(kube, kube_conn, task_context, capsys):
    context = task_context("kpo-ok")
    code = "import time; print('hello from the pod'); time.sleep(1); print('bye')"
    kpo("kpo-ok", code, kube_conn).execute(context)
    out = capsys.readouterr().out  # Airflow 3 logs through structlog to stdout
    assert "[base] hello from the pod" in out and "[base] bye" in out
    assert "Pod has reached Running phase" in out
    assert context["ti"].pushed["pod_namespace"] == NS
    assert not kube.list_namespaced_pod(NS, label_selector="task_id=kpo-ok").items  # deleted when done


def test_kubernetes_pod_operator_fails_for_a_failing_pod(kube, kube_conn, task_context, capsys):
    from airflow.providers.common.compat.sdk import AirflowException

    with pytest.raises(AirflowException, match="returned a failure"):
        kpo("kpo-bad", "import sys; print('about to fail'); sys.exit(4)", kube_conn).execute(task_context("kpo-bad"))
    out = capsys.readouterr().out
    assert "[base] about to fail" in out
    assert "Container 'base': state='TERMINATED', reason='Error', exit_code=4" in out
    assert not kube.list_namespaced_pod(NS, label_selector="task_id=kpo-bad").items
