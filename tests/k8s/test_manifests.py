"""Manifests from pipelines.launch.k8s / render: schema-valid, restricted, traceable, matching the plan."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from k8s_support import GPU_POOL, LOCAL_POOL
from restricted import restricted_violations

from pipelines.__main__ import main
from pipelines.core.plan import default_plan, load_plan
from pipelines.core.stages import rank_command
from pipelines.launch import k8s
from pipelines.launch.render import render_job
from pipelines.launch.rendezvous import RENDEZVOUS_PORT
from pipelines.spec import SpecError, load_pool, load_spec

K8S_VERSION = "1.37.0"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
TRAIN_ID = k8s.Identity(dag_id="train_pipeline", run_id=RUN_ID, task_id="train")  # the rendered job's


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


@pytest.fixture
def rendered(spec_doc, mixed_plan) -> dict[str, dict]:
    spec_doc["kubernetes"]["kueue_queue"] = "gpu-queue"
    return render_job(spec_doc, GPU_POOL, mixed_plan, dag_id="train_pipeline", run_id=RUN_ID)


def test_every_manifest_validates_against_the_kubernetes_schema(rendered, spec_doc):
    local = dict(spec_doc, pool=LOCAL_POOL, training={"global_batch": "auto"})
    manifests = list(rendered.values()) + list(render_job(local).values())
    # Service, ranks, stage pods, calibration pods, and the range test's Service and rank pods
    assert len(manifests) == (1 + 3 + 5 + 3 + 1 + 3) + (1 + 2 + 5 + 2 + 1 + 2)
    for manifest in manifests:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_schema_validation_catches_a_broken_manifest(rendered):
    broken = copy.deepcopy(rendered["rank-0.yaml"])
    broken["spec"]["containers"][0]["resources"]["limits"]["cpu"] = {"not": "a quantity"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_every_pod_meets_the_restricted_pod_security_standard(rendered):
    pods = [m for m in rendered.values() if m["kind"] == "Pod"]
    assert len(pods) == 3 + 5 + 3 + 3
    for pod in pods:
        assert restricted_violations(pod) == [], pod["metadata"]["name"]
        sc = pod["spec"]["containers"][0]["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert pod["spec"]["securityContext"]["runAsUser"] == k8s.RUN_AS_USER
        mounts = {vm["mountPath"] for vm in pod["spec"]["containers"][0]["volumeMounts"]}
        assert "/tmp" in mounts and "/mnt/artifacts" in mounts  # writable places on a read-only root


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
            "allowPrivilegeEscalation",
        ),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].update(capabilities={"drop": []}),
            "drop must include ALL",
        ),
        (
            lambda p: [
                p["spec"]["securityContext"].pop("seccompProfile"),
                p["spec"]["containers"][0]["securityContext"].pop("seccompProfile"),
            ],
            "seccompProfile",
        ),
        (lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
        (lambda p: p["spec"].update(automountServiceAccountToken=True), "automountServiceAccountToken"),
        (
            lambda p: p["spec"]["containers"][0]["env"].append(
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}
            ),
            "plain value",
        ),
        (lambda p: p["spec"].update(hostNetwork=True), "hostNetwork"),
        (lambda p: p["spec"]["securityContext"].update(runAsUser=0), "spec.securityContext.runAsUser"),
        (lambda p: p["spec"]["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (lambda p: p["spec"]["containers"][0]["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].pop("readOnlyRootFilesystem"),
            "readOnlyRoot",
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="999"),
            "requests must equal",
        ),
    ],
)
def test_the_restricted_check_flags_each_missing_field(rendered, breakage, expected):
    pod = copy.deepcopy(rendered["rank-1.yaml"])
    breakage(pod)
    violations = restricted_violations(pod)
    assert len(violations) == 1 and expected in violations[0], violations


def test_rank_pods_match_the_plan(rendered, mixed_plan):
    pool = load_pool(GPU_POOL)
    for r in mixed_plan["ranks"]:
        pod = rendered[f"rank-{r['rank']}.yaml"]
        device = pool.get(r["device"])
        c = pod["spec"]["containers"][0]
        assert c["resources"]["requests"] == c["resources"]["limits"] == device.kubernetes.resources
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["spec"]["nodeSelector"] == device.kubernetes.node_selector
        assert pod["spec"]["tolerations"] == device.kubernetes.tolerations
        env = _env(pod)
        assert env["HETERO_LOCAL_BATCH"] == str(r["batch"])
        assert env["HETERO_DEVICE_TYPE"] == r["device"]
        assert env["HOROVOD_RANK"] == str(r["rank"]) and env["HOROVOD_SIZE"] == "3"
        assert env["HETERO_CPU_THREADS"] == device.kubernetes.resources["cpu"]
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == rendered["service.yaml"]["metadata"]["name"] + ".ml.svc"
        assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(rendered["service.yaml"]["spec"]["ports"][0]["port"])
        assert ("HETERO_HOST_RENDEZVOUS" in env) == (r["rank"] == 0)
        run_dir = c["command"][c["command"].index("--run-dir") + 1]
        assert c["command"] == rank_command(run_dir)  # the local launcher's rank command, in the image
        assert c["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]


def test_each_try_has_its_own_rendezvous_port_in_the_documented_range():
    """Where pods share one network (hostNetwork, the test cluster), concurrent jobs and a try and
    the one before it must not bind the same port."""
    ports = {k8s.rendezvous_port(k8s.Identity(run_id=f"run-{i}", try_number=t)) for i in range(20) for t in (1, 2)}
    assert len(ports) > 30 and all(RENDEZVOUS_PORT <= p < RENDEZVOUS_PORT + k8s.RENDEZVOUS_PORTS for p in ports)
    assert k8s.rendezvous_port(TRAIN_ID) == k8s.rendezvous_port(k8s.Identity(**vars(TRAIN_ID)))  # stable


def test_the_headless_service_selects_rank_zero_only(rendered):
    svc = rendered["service.yaml"]
    assert svc["spec"]["clusterIP"] == "None"
    port = svc["spec"]["ports"][0]["port"]
    assert port == svc["spec"]["ports"][0]["targetPort"] == k8s.rendezvous_port(TRAIN_ID)
    assert rendered["rank-0.yaml"]["spec"]["containers"][0]["ports"][0]["containerPort"] == port
    selected = [
        name
        for name, m in rendered.items()
        if m["kind"] == "Pod"
        and all(m["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
    ]
    assert selected == ["rank-0.yaml"]


def test_labels_trace_each_pod_to_its_task_and_are_valid(rendered):
    for m in rendered.values():
        labels = m["metadata"]["labels"]
        for key, value in labels.items():
            assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)
        assert labels["dag_id"] == "train_pipeline"
        assert labels["try_number"] == "1"
        assert m["metadata"]["annotations"]["hetero.io/run-id"] == RUN_ID
    pod = rendered["rank-2.yaml"]["metadata"]["labels"]
    assert (pod["task_id"], pod["rank"], pod["device_type"]) == ("train", "2", "t4")
    assert pod["run_id"] != RUN_ID  # ':' and '+' are not allowed in label values


@pytest.mark.parametrize("value", [RUN_ID, "scheduled__2026-01-01", "x" * 80, "-bad-", "ok.value_1"])
def test_label_values_are_the_same_as_the_providers(value):
    from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value

    assert k8s.label_value(value) == make_safe_label_value(value)


def test_kueue_gang_labels(rendered):
    for r in range(3):
        meta = rendered[f"rank-{r}.yaml"]["metadata"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == rendered["service.yaml"]["metadata"]["name"]
        assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"
    assert "kueue.x-k8s.io/pod-group-name" not in rendered["stage-preload.yaml"]["metadata"]["labels"]


def test_service_account_token_only_when_asked(spec_doc, mixed_plan):
    ident = k8s.Identity()
    pool = load_pool(GPU_POOL)
    pod = k8s.rank_pod_manifests(load_spec(spec_doc), pool, mixed_plan, ident)[0]
    assert pod["spec"]["automountServiceAccountToken"] is False and "serviceAccountName" not in pod["spec"]
    spec_doc["kubernetes"]["service_account_name"] = "trainer"
    pod = k8s.rank_pod_manifests(load_spec(spec_doc), pool, mixed_plan, ident)[0]
    assert (
        pod["spec"]["automountServiceAccountToken"] is True and pod["spec"]["serviceAccountName"] == "trainer"
    )


def test_stage_pod_on_a_device_type_takes_its_resources(spec_doc):
    spec = load_spec(spec_doc)
    pod = k8s.stage_pod_manifest(spec, "lr_search", k8s.Identity(), pool=load_pool(GPU_POOL), device="v100")
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    with pytest.raises(SpecError, match="train"):
        k8s.stage_pod_manifest(spec, "train", k8s.Identity())


def test_default_plan_splits_the_global_batch(spec_doc):
    spec, pool = load_spec(spec_doc), load_pool(GPU_POOL)
    plan = default_plan(spec, pool)
    assert len(plan["ranks"]) == 14 and plan["global_batch"] == 256
    assert sum(r["batch"] for r in plan["ranks"]) == 256
    by_device = {r["device"]: r["batch"] for r in plan["ranks"]}
    assert by_device["a100"] > by_device["v100"]  # proportional to memory
    auto = default_plan(load_spec(dict(spec_doc, training={"global_batch": "auto"})), pool)
    assert {r["batch"] for r in auto["ranks"]} == {64}


def test_bad_plans_are_named(spec_doc, mixed_plan):
    spec, pool = load_spec(spec_doc), load_pool(GPU_POOL)
    bad = copy.deepcopy(mixed_plan)
    bad["ranks"][1]["device"] = "h100"
    with pytest.raises(SpecError, match="h100"):
        k8s.rank_pod_manifests(spec, pool, bad, k8s.Identity())
    bad = copy.deepcopy(mixed_plan)
    bad["ranks"][2]["batch"] = 0
    with pytest.raises(SpecError, match=r"^plan\.ranks\[2\]\.batch: must be a positive integer, got 0"):
        k8s.rank_pod_manifests(spec, pool, bad, k8s.Identity())
    bad = copy.deepcopy(mixed_plan)
    bad["ranks"][1]["rank"] = "1"
    with pytest.raises(SpecError, match=r"^plan\.ranks\[1\]\.rank: must be an integer, got '1'"):
        k8s.rank_pod_manifests(spec, pool, bad, k8s.Identity())
    bad = copy.deepcopy(mixed_plan)
    bad["ranks"][1]["rank"] = 3
    with pytest.raises(SpecError, match=r"numbered 0\.\.2, got rank 2 at position 1"):
        k8s.rank_pod_manifests(spec, pool, bad, k8s.Identity())


def test_rank_pods_follow_the_rank_numbers_not_the_list_order(spec_doc, mixed_plan):
    spec, pool = load_spec(spec_doc), load_pool(GPU_POOL)
    shuffled = dict(mixed_plan, ranks=list(reversed(mixed_plan["ranks"])))
    pods = k8s.rank_pod_manifests(spec, pool, shuffled, k8s.Identity())
    assert [p["metadata"]["labels"]["device_type"] for p in pods] == ["a100", "v100", "t4"]


def test_rank_env_places_the_rank_and_its_device(spec_doc):
    from pipelines.launch.rendezvous import pod_slots

    device = load_pool(GPU_POOL).get("t4")
    slots = pod_slots(3)
    env = k8s.rank_env(slots[2], device, 32, "hvd.ml.svc")
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"]) == ("2", "3", "0")
    assert (env["HETERO_DEVICE_TYPE"], env["HETERO_LOCAL_BATCH"]) == ("t4", "32")
    assert env["HETERO_CPU_SHARE"] == str(float(device.kubernetes.resources["cpu"]))
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "hvd.ml.svc" and env["HOROVOD_GLOO_IFACE"] == "eth0"
    assert "HETERO_HOST_RENDEZVOUS" not in env
    assert k8s.rank_env(slots[0], device, 32, "hvd.ml.svc")["HETERO_HOST_RENDEZVOUS"] == "1"


def test_load_plan_accepts_files_results_and_python_literals(tmp_path, mixed_plan):
    (tmp_path / "result.json").write_text(json.dumps({"plan": mixed_plan, "model": {}}))
    assert load_plan(tmp_path / "result.json") == mixed_plan
    assert load_plan(str(mixed_plan)) == mixed_plan
    with pytest.raises(SpecError, match="not found"):
        load_plan(str(tmp_path / "missing.json"))


def test_no_manifest_without_a_shared_volume(spec_doc, mixed_plan):
    spec_doc["kubernetes"].pop("artifact_volume_claim")
    with pytest.raises(SpecError, match="artifact_volume_claim: required with launcher kubernetes"):
        load_spec(spec_doc)  # the spec itself refuses it (tests/k8s/test_validation.py)
    local = dict(spec_doc, launcher="local")  # valid as a local job, but its pods could not share a run
    for render in (lambda: render_job(local, GPU_POOL, mixed_plan),
                   lambda: k8s.stage_pod_manifest(load_spec(local), "preload", k8s.Identity())):
        with pytest.raises(SpecError, match="artifact_volume_claim"):
            render()
    with pytest.raises(SpecError, match="artifact_root: 's3://bucket/runs' is a remote URI"):
        load_spec(dict(spec_doc, artifact_root="s3://bucket/runs"))  # preload could not use it


def test_render_cli_writes_yaml_without_a_cluster(tmp_path, spec_doc, mixed_plan, capsys):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec_doc))
    (tmp_path / "plan.json").write_text(json.dumps(mixed_plan))
    out = tmp_path / "manifests"
    argv = [
        "render",
        "--spec",
        str(tmp_path / "job.yaml"),
        "--pool",
        GPU_POOL,
        "--plan",
        str(tmp_path / "plan.json"),
    ]
    assert main([*argv, "--out", str(out), "--run-id", RUN_ID, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = sorted(p.name for p in out.iterdir())
    assert result["count"] == len(names) == 16
    assert "rank-2.yaml" in names and {"stage-publish.yaml", "stage-promote.yaml"} <= set(names)
    # learning_rate auto: the range test is a gang of the plan's rank pods, not a stage pod
    assert "stage-lr_search.yaml" not in names and {"lr_search-service.yaml", "lr_search-rank-2.yaml"} <= set(names)
    search = yaml.safe_load((out / "lr_search-rank-1.yaml").read_text())
    command = search["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "pipelines.lr_search.ranks"] and search["metadata"]["labels"]["task_id"] == "lr_search"
    pod = yaml.safe_load((out / "rank-1.yaml").read_text())
    assert pod["metadata"]["annotations"]["hetero.io/run-id"] == RUN_ID
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_the_example_rbac_role_allows_every_call_the_operators_make():
    docs = list(yaml.safe_load_all((Path(GPU_POOL).parent / "rbac.yaml").read_text()))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    role = next(d for d in docs if d["kind"] == "Role")
    allowed = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    needed = {
        ("pods", "create"), ("pods", "list"), ("pods", "get"), ("pods", "delete"), ("pods", "patch"),
        ("pods/log", "get"), ("services", "create"), ("services", "list"), ("services", "delete"),
        ("events", "list"),
    }  # fmt: skip
    assert needed <= allowed, needed - allowed
    assert not any(res in ("pods/exec", "secrets") for res, _ in allowed)
