"""The Kubernetes permissions the project uses, in one place: ``examples/rbac.yaml`` grants exactly
these (a test parses it and compares), ``python -m pipelines check-cluster`` asks the API server
for each of them (SelfSubjectAccessReview), and the test cluster's tests check that every call the
code made is one of them.  Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["CHECK_PERMISSIONS", "LAUNCHER_PERMISSIONS", "permission_set", "rules_permissions"]

# (resource or resource/subresource, verbs), all in the core API group ("").  The Role
# hetero-pipelines-launcher: what the Airflow worker needs in spec.kubernetes.namespace to run
# pods (plugins/hetero/kube, the provider's pod operator and trigger).
LAUNCHER_PERMISSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pods", ("create", "get", "list", "watch", "delete", "patch")),
    ("pods/log", ("get",)),
    ("services", ("create", "get", "list", "delete")),
    ("events", ("get", "list", "watch")),
)

# The ClusterRole hetero-pipelines-cluster-check: the reads of ``check-cluster`` itself
# (namespaces and nodes are cluster-scoped; the claim is read in the job's namespace).
CHECK_PERMISSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("namespaces", ("get",)),
    ("nodes", ("list",)),
    ("persistentvolumeclaims", ("get",)),
)


def permission_set(permissions: Iterable[tuple[str, Sequence[str]]]) -> set[tuple[str, str]]:
    """``{(verb, "resource[/subresource]")}`` of a permissions table."""
    return {(verb, resource) for resource, verbs in permissions for verb in verbs}


def rules_permissions(rules: Iterable[Mapping]) -> set[tuple[str, str]]:
    """``{(verb, "resource[/subresource]")}`` that RBAC ``rules`` (a Role's ``rules``) list for the core
    group; a wildcard stays ``"*"``."""
    out: set[tuple[str, str]] = set()
    for rule in rules:
        if "" not in (rule.get("apiGroups") or []) and "*" not in (rule.get("apiGroups") or []):
            continue
        out |= {(verb, res) for res in rule.get("resources") or [] for verb in rule.get("verbs") or []}
    return out

