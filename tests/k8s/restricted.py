"""Checks of the Pod Security Standard "restricted" profile (plus our own hardening rules) on pod dicts."""

from __future__ import annotations

from typing import Any

ALLOWED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every way ``pod`` (API field names) breaks the restricted profile or our hardening rules."""
    spec = pod["spec"]
    psc = spec.get("securityContext") or {}
    out = pod_violations(spec)
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        out += container_violations(c, psc)
    return out


def pod_violations(spec: dict[str, Any]) -> list[str]:
    """Pod-level rules: host namespaces, volume types, root user, service-account token."""
    psc = spec.get("securityContext") or {}
    out: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"spec.{field} must be unset or false")
    for vol in spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= ALLOWED_VOLUME_TYPES:
            out.append(f"volume {vol['name']}: type {sorted(kinds)} not allowed")
    if psc.get("runAsUser") == 0:
        out.append("spec.securityContext.runAsUser must not be 0")
    if spec.get("automountServiceAccountToken") is not False and not spec.get("serviceAccountName"):
        out.append("spec.automountServiceAccountToken must be false when no service account is asked for")
    return out


def container_violations(c: dict[str, Any], psc: dict[str, Any]) -> list[str]:
    """One container's rules; ``psc`` is the pod's securityContext (its defaults)."""
    where = f"container {c['name']}"
    sc = c.get("securityContext") or {}
    out: list[str] = []
    if sc.get("privileged"):
        out.append(f"{where}: privileged")
    if any(p.get("hostPort") for p in c.get("ports") or []):
        out.append(f"{where}: hostPort")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation must be false")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"{where}: capabilities.drop must include ALL")
    if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        out.append(f"{where}: capabilities.add may only hold NET_BIND_SERVICE")
    if not (
        sc.get("runAsNonRoot") is True
        or (psc.get("runAsNonRoot") is True and sc.get("runAsNonRoot") is not False)
    ):
        out.append(f"{where}: runAsNonRoot must be true")
    if sc.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser must not be 0")
    seccomp = (sc.get("seccompProfile") or {}).get("type") or (psc.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost")
    return out + hardening_violations(c)


def hardening_violations(c: dict[str, Any]) -> list[str]:
    """Our own rules beyond the profile (docs/ARCHITECTURE.md, "Failure rules")."""
    where = f"container {c['name']}"
    out: list[str] = []
    if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
        out.append(f"{where}: readOnlyRootFilesystem must be true")
    for env in c.get("env") or []:
        if "value" in env and any(w in env["name"].upper() for w in ("SECRET", "PASSWORD", "TOKEN", "KEY")):
            out.append(f"{where}: env {env['name']} looks like a credential given as a plain value")
    res = c.get("resources") or {}
    if not res.get("limits") or res.get("requests") != res.get("limits"):
        out.append(f"{where}: resources.requests must equal resources.limits")
    return out
