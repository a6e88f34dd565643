"""``python -m pipelines check-cluster``: is the live cluster ready for this job and pool?

Checks, each ``ok`` or one line naming what to fix: the namespace exists; every permission of
:data:`~pipelines.launch.k8s.permissions.LAUNCHER_PERMISSIONS` is allowed there
(SelfSubjectAccessReview, so it answers for whoever the kubeconfig names); the claim
``kubernetes.artifact_volume_claim`` exists, is Bound and ReadWriteMany; for each device type of
the pool, some node matches its nodeSelector, required node affinity and tolerations, with
allocatable CPU, memory and other resources at least its requests, and a GPU type finds a node with
that many GPUs; the spec's image and storage settings (:func:`pipelines.spec.check_kubernetes`'s
rules).  It compares requests with allocatable capacity, not with what running pods leave free.

The rules are plain functions over API objects as dicts (camelCase, as the API sends them), so
they are tested without a cluster; :class:`KubeCluster` reads them with the official ``kubernetes``
client, which only the Airflow environment has.  See docs/guide/kubernetes.md, "Check the cluster".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from pipelines.errors import StageError
from pipelines.launch.k8s.permissions import LAUNCHER_PERMISSIONS
from pipelines.spec import JobSpec, PoolSpec, SpecError, kubernetes_storage_problems, load_pool
from pipelines.spec.checks import gpu_image_problems
from pipelines.spec.defaults import ENV_JOB_DEFAULTS, deep_merge, defaults_source, describe, load_job_defaults
from pipelines.spec.kube import parse_quantity
from pipelines.spec.loading import format_validation_error, read_mapping

__all__ = ["Check", "ClusterReader", "Forbidden", "KubeCluster", "check_cluster", "check_cluster_command",
           "cluster_report", "failure_message", "node_problem", "report_lines"]

CHECK_ROLE = "the ClusterRole hetero-pipelines-cluster-check of examples/rbac.yaml"
LAUNCHER_ROLE = "the Role hetero-pipelines-launcher of examples/rbac.yaml"


class Forbidden(Exception):
    """The kubeconfig's user may not make this read (HTTP 403)."""


class ClusterReader(Protocol):
    """What the check reads; objects are API dicts, ``None`` when not found."""

    def namespace(self, name: str) -> dict | None: ...
    def nodes(self) -> list[dict]: ...
    def claim(self, namespace: str, name: str) -> dict | None: ...
    def allowed(self, namespace: str, verb: str, resource: str, subresource: str) -> bool: ...


@dataclass
class Check:
    name: str
    ok: bool
    message: str


# -- nodes


def _quantity(value: Any) -> Decimal:
    try:
        return parse_quantity(str(value))
    except ValueError:
        return Decimal(0)


def _allocatable(node: Mapping) -> dict:
    return (node.get("status") or {}).get("allocatable") or {}


def _tolerated(taint: Mapping, tolerations: list[Mapping]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_matches(expr: Mapping, labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term_matches(term: Mapping, node: Mapping) -> bool:
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return (all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
            and all(_expression_matches(e, fields) for e in term.get("matchFields") or []))


def node_problem(node: Mapping, placement: Mapping[str, Any], resources: Mapping[str, str]) -> str | None:
    """Why a pod with this placement (the pool's ``node_selector``, ``tolerations``, ``affinity``) and
    these requests cannot run on ``node``, or None; the first reason, in the scheduler's order."""
    labels = node["metadata"].get("labels") or {}
    if (node.get("spec") or {}).get("unschedulable"):
        return "unschedulable (cordoned)"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, placement.get("tolerations") or []):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    for key, value in (placement.get("node_selector") or {}).items():
        if labels.get(key) != value:
            have = f"has {key}={labels[key]}" if key in labels else f"no label {key}"
            return f"nodeSelector {key}={value} ({have})"
    required = ((placement.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(_term_matches(t, node) for t in terms):
        return "required node affinity not matched"
    allocatable = _allocatable(node)
    for name, value in resources.items():
        if _quantity(allocatable.get(name, 0)) < _quantity(value):
            return f"{name}: requests {value}, allocatable {allocatable.get(name, 0)}"
    return None


def _placement_checks(pool: PoolSpec, nodes: list[dict]) -> list[Check]:
    out = []
    for device in pool.device_types:
        k = device.kubernetes
        placement = {"node_selector": k.node_selector, "tolerations": k.tolerations, "affinity": k.affinity}
        cpu_mem = {n: v for n, v in k.resources.items() if not n.endswith("/gpu")}
        gpus = {n: v for n, v in k.resources.items() if n.endswith("/gpu")}
        why = {n["metadata"]["name"]: node_problem(n, placement, cpu_mem) for n in nodes}
        fits = [name for name, problem in why.items() if problem is None]
        name = f"device type {device.name}"
        if not nodes:
            out.append(Check(name, False, f"{name}: the cluster lists no nodes"))
            continue
        if not fits:
            reasons = "; ".join(f"{n}: {p}" for n, p in why.items())
            out.append(Check(name, False, f"{name}: no node matches its placement and requests ({reasons}): fix the "
                             "pool's kubernetes node_selector, tolerations, affinity or resources, or the nodes"))
            continue
        out.append(Check(name, True, f"{name}: fits on {', '.join(fits)}"))
        if not device.requests_gpu:
            continue
        by_name = {n["metadata"]["name"]: n for n in nodes}
        gpu_fits = [n for n in fits if node_problem(by_name[n], placement, gpus) is None]
        want = ", ".join(f"{n}: {v}" for n, v in gpus.items())
        if gpu_fits:
            out.append(Check(f"gpu {device.name}", True, f"GPUs for {device.name} ({want}) on {', '.join(gpu_fits)}"))
        else:
            have = "; ".join(f"{n}: " + ", ".join(f"{g}={_allocatable(by_name[n]).get(g, 0)}" for g in gpus)
                             for n in fits)
            out.append(Check(f"gpu {device.name}", False, f"device type {device.name} requests {want} but no node it fits "
                             f"on has that GPU capacity ({have}): install the GPU device plugin on those nodes, or "
                             "fix the type's node_selector"))
    return out


# -- the checks


def _namespace_check(spec: JobSpec, cluster: ClusterReader) -> Check:
    ns = spec.kubernetes.namespace
    try:
        found = cluster.namespace(ns) is not None
    except Forbidden:
        return Check("namespace", False, f"namespace {ns}: this kubeconfig's user may not get namespaces: grant "
                     f"{CHECK_ROLE}, or run check-cluster as a user who can")
    if found:
        return Check("namespace", True, f"namespace {ns} exists")
    return Check("namespace", False, f"kubernetes.namespace: namespace {ns!r} does not exist: create it "
                 f"(kubectl create namespace {ns}) or fix kubernetes.namespace")


def _rbac_checks(spec: JobSpec, cluster: ClusterReader) -> list[Check]:
    ns, out = spec.kubernetes.namespace, []
    for resource, verbs in LAUNCHER_PERMISSIONS:
        main, _, sub = resource.partition("/")
        for verb in verbs:
            name = f"rbac {verb} {resource}"
            if cluster.allowed(ns, verb, main, sub):
                out.append(Check(name, True, f"may {verb} {resource} in {ns}"))
            else:
                out.append(Check(name, False, f"RBAC: may not {verb} {resource} in namespace {ns}: apply "
                                 f"{LAUNCHER_ROLE} to the Airflow worker's service account"))
    return out


def _claim_check(spec: JobSpec, cluster: ClusterReader) -> Check:
    ns, claim = spec.kubernetes.namespace, spec.kubernetes.artifact_volume_claim
    field = "kubernetes.artifact_volume_claim"
    if not claim:
        return Check("claim", False, f"{field}: not set: name a ReadWriteMany PersistentVolumeClaim")
    try:
        pvc = cluster.claim(ns, claim)
    except Forbidden:
        return Check("claim", False, f"{field}: this kubeconfig's user may not get persistentvolumeclaims in {ns}: "
                     f"grant {CHECK_ROLE}, or run check-cluster as a user who can")
    if pvc is None:
        return Check("claim", False, f"{field}: PersistentVolumeClaim {claim!r} not found in namespace {ns}: "
                     "create it (ReadWriteMany) or fix the name")
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    if phase != "Bound":
        return Check("claim", False, f"{field}: PersistentVolumeClaim {claim!r} is {phase}, not Bound: give it a "
                     "volume (a storage class or PersistentVolume that can provide ReadWriteMany)")
    modes = (pvc.get("spec") or {}).get("accessModes") or []
    if "ReadWriteMany" not in modes:
        return Check("claim", False, f"{field}: PersistentVolumeClaim {claim!r} has access modes {modes}, not "
                     "ReadWriteMany: pods on several nodes share the run directory; use a ReadWriteMany claim")
    return Check("claim", True, f"claim {claim} is Bound and ReadWriteMany")


def _spec_checks(spec: JobSpec, pool: PoolSpec) -> list[Check]:
    k = spec.kubernetes
    problems = kubernetes_storage_problems(spec)
    if k.gpu_image is None and not k.allow_cpu_image_on_gpu:
        problems += gpu_image_problems(k.image, pool.device_types)
    if not problems:
        gpu = k.gpu_image or (f"{k.image} (allow_cpu_image_on_gpu)" if any(d.requests_gpu for d in pool.device_types)
                              else "not needed")
        return [Check("images", True, f"image {k.image}; GPU image {gpu}")]
    return [Check("images", False, f"{field}: {message}") for field, message in problems]


def check_cluster(spec: JobSpec, pool: PoolSpec, cluster: ClusterReader) -> list[Check]:
    """Every check, in order: namespace, RBAC, claim, device types (and their GPUs), images."""
    checks = [_namespace_check(spec, cluster), *_rbac_checks(spec, cluster), _claim_check(spec, cluster)]
    try:
        checks += _placement_checks(pool, cluster.nodes())
    except Forbidden:
        checks.append(Check("nodes", False, f"nodes: this kubeconfig's user may not list nodes: grant {CHECK_ROLE}, "
                            "or run check-cluster as a user who can"))
    return checks + _spec_checks(spec, pool)


def report_lines(result: Mapping[str, Any]) -> list[str]:
    """One line a check: ``ok``, or ``FAIL`` and what to fix; then the verdict."""
    lines = [f"{'ok  ' if c['ok'] else 'FAIL'}  {c['message']}" for c in result["checks"]]
    failed = len(result["failures"])
    verdict = "the cluster is ready for this job" if not failed else f"{failed} check(s) failed"
    return [*lines, f"{verdict} (cluster {result['context'] or 'in-cluster'}, namespace {result['namespace']})"]


# -- the live cluster


class KubeCluster:
    """:class:`ClusterReader` over the official ``kubernetes`` client."""

    def __init__(self, api_client):
        # The kubernetes client is only in the Airflow environment (.venv); imported where it is used
        # so that the rest of `python -m pipelines` runs in the trainer environment without it.
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.auth = client.AuthorizationV1Api(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> tuple[KubeCluster, str | None]:
        """The cluster of ``kubeconfig`` (default ``$KUBECONFIG`` or ``~/.kube/config``) and ``context``,
        or the in-cluster service account when there is no kubeconfig; and the context's name."""
        try:
            from kubernetes import client, config  # see __init__
        except ImportError:
            raise StageError("check-cluster needs the kubernetes Python client: run it with the Airflow "
                             "environment's python (.venv/bin/python -m pipelines check-cluster)") from None
        try:
            if kubeconfig is None and not _default_kubeconfig_exists():
                config.load_incluster_config()
                return cls(client.ApiClient()), None
            api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            return cls(api_client), context or active["name"]
        except config.ConfigException as e:
            raise StageError(f"kubeconfig {kubeconfig or '(default)'}: {e}") from None

    def _call(self, what: str, read):
        from kubernetes.client.exceptions import ApiException  # see __init__
        from urllib3.exceptions import HTTPError  # the kubernetes client's transport

        try:
            return self.api_client.sanitize_for_serialization(read())
        except ApiException as e:
            if e.status == 404:
                return None
            if e.status == 403:
                raise Forbidden(what) from None
            raise StageError(f"the API server answered {e.status} {e.reason} to {what}") from None
        except (HTTPError, OSError) as e:  # cannot connect, or the connection broke
            raise StageError(f"cannot reach the API server at {self.api_client.configuration.host}: {e}") from None

    def namespace(self, name: str) -> dict | None:
        return self._call(f"get namespace {name}", lambda: self.core.read_namespace(name))

    def nodes(self) -> list[dict]:
        return (self._call("list nodes", self.core.list_node) or {}).get("items") or []

    def claim(self, namespace: str, name: str) -> dict | None:
        return self._call(f"get persistentvolumeclaim {name}",
                          lambda: self.core.read_namespaced_persistent_volume_claim(name, namespace))

    def allowed(self, namespace: str, verb: str, resource: str, subresource: str) -> bool:
        attributes = {"namespace": namespace, "verb": verb, "group": "", "resource": resource}
        if subresource:
            attributes["subresource"] = subresource
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}
        try:
            review = self._call("create selfsubjectaccessreview",
                                lambda: self.auth.create_self_subject_access_review(body))
        except Forbidden:
            return False
        return bool(((review or {}).get("status") or {}).get("allowed"))


def _default_kubeconfig_exists() -> bool:
    paths = os.environ.get("KUBECONFIG", "").split(os.pathsep) if os.environ.get("KUBECONFIG") else []
    return any(Path(p).expanduser().is_file() for p in paths or ["~/.kube/config"])


def cluster_report(spec: JobSpec, pool: PoolSpec, cluster: ClusterReader, context: str | None) -> dict[str, Any]:
    """The result of :func:`check_cluster`: ``ok``, ``namespace``, ``context``, ``checks``, ``failures``."""
    checks = check_cluster(spec, pool, cluster)
    failures = [c.message for c in checks if not c.ok]
    return {"ok": not failures, "namespace": spec.kubernetes.namespace, "context": context,
            "checks": [asdict(c) for c in checks], "failures": failures}


def failure_message(result: Mapping[str, Any]) -> str:
    failures = result["failures"]
    return "\n".join([f"the cluster is not ready for this job: {len(failures)} check(s) failed", *failures])


def job_to_check(spec_source: str | None) -> tuple[JobSpec, str]:
    """The job a run of this deployment gets: ``spec_source`` (a file or inline JSON; may be None)
    deep-merged over the deployment's job defaults (``HETERO_JOB_DEFAULTS``, relative paths taken
    from the defaults file's folder), as every run's conf is; and a phrase naming the sources.  A
    :class:`SpecError` names the source of a bad value, or says that neither was given."""
    defaults = load_job_defaults()  # {} without HETERO_JOB_DEFAULTS
    source = defaults_source()
    if spec_source is None and source is None:
        raise SpecError(f"check-cluster needs the job to check: --spec, or the deployment's job defaults "
                        f"file named by {ENV_JOB_DEFAULTS}")
    given, where = read_mapping(spec_source, "job spec") if spec_source is not None else ({}, None)
    if where is not None and where == str(spec_source).strip():  # read from a file: where is its path
        where = f"job spec {where}"
    sources = [w for w in (where, source and describe(source)) if w]
    try:
        return JobSpec.model_validate(deep_merge(defaults, given)), " over ".join(sources)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, " over ".join(sources))) from None


def check_cluster_command(args) -> int:
    """``python -m pipelines check-cluster``: print one line a check (and with ``--json`` the result as
    the last line); exit 0 when all pass, else a :class:`StageError` listing the failures (exit 2)."""
    spec, job = job_to_check(args.spec)
    pool = load_pool(args.pool or spec.pool)
    cluster, context = KubeCluster.connect(args.kubeconfig, args.context)
    result = cluster_report(spec, pool, cluster, context) | {"job": job}
    print("\n".join([f"checking the job of {job}", *report_lines(result)]), flush=True)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
    if result["failures"]:
        raise StageError(failure_message(result))
    return 0
