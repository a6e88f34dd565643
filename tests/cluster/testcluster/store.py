"""The test cluster's object store: server defaults, validation, selectors, patches, watch history.

TEST INFRASTRUCTURE, not product code: the API server of ``tests/cluster`` keeps its objects here.
Every object a client sends is defaulted as a real API server defaults it, then checked against the
Kubernetes JSON schema (``kubernetes_validate``, strict) and the name and value rules a real server
applies, and refused with the same ``Status`` (422 Invalid, 409 AlreadyExists, 404 NotFound).
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime as dt
import re
import threading
import uuid

import kubernetes_validate

SCHEMA_VERSION = kubernetes_validate.latest_version()
KINDS = {"pods": "Pod", "services": "Service", "secrets": "Secret", "events": "Event", "nodes": "Node",
         "persistentvolumeclaims": "PersistentVolumeClaim"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


class ApiError(Exception):
    """An error the API server answers with a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})


def now(precise: bool = False) -> str:
    t = dt.datetime.now(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{t.microsecond:06d}Z" if precise else "Z")


def quantity(value) -> float:
    """A resource quantity ("500m", "2Gi", 1) as a number (cores, bytes, devices)."""
    m = QUANTITY.match(str(value))
    if not m:
        raise ValueError(value)
    number, suffix = m.groups()
    if suffix in SUFFIX:
        return float(number) * SUFFIX[suffix]
    return float(number) * 10 ** int(suffix[1:])  # exponent form: 1e3


# -- defaults (what the API server fills in before it stores an object)

def default_pod(pod: dict) -> None:
    spec = pod.setdefault("spec", {})
    for key, value in (("restartPolicy", "Always"), ("dnsPolicy", "ClusterFirst"), ("enableServiceLinks", True),
                       ("schedulerName", "default-scheduler"), ("terminationGracePeriodSeconds", 30),
                       ("serviceAccountName", "default"), ("securityContext", {}), ("priority", 0)):
        if spec.get(key) is None:
            spec[key] = value
    for c in spec.get("containers") or []:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        image = str(c.get("image") or "")
        c.setdefault("imagePullPolicy", "Always" if ":" not in image or image.endswith(":latest") else "IfNotPresent")
        res = c.setdefault("resources", {})
        if res.get("limits"):  # requests default to limits
            res["requests"] = {**res["limits"], **(res.get("requests") or {})}
        for port in c.get("ports") or []:
            port.setdefault("protocol", "TCP")
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec.get("containers") or [])}  # a client's is ignored


def qos_class(containers: list[dict]) -> str:
    res = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in res):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(k) is not None and (r.get("limits") or {}).get(k) == (r.get("requests") or {}).get(k)
        for r in res for k in ("cpu", "memory"))
    return "Guaranteed" if guaranteed else "Burstable"


def default_service(svc: dict, counter: int) -> None:
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec.get("clusterIP") != "None":
        spec["clusterIP"] = f"10.96.{counter // 250 % 250}.{counter % 250 + 2}"
    spec["clusterIPs"] = [spec["clusterIP"]]
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    svc.setdefault("status", {"loadBalancer": {}})


def default_secret(secret: dict) -> None:
    secret.setdefault("type", "Opaque")
    data = secret.get("data") or {}
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    secret["data"] = data


# -- validation

def schema_causes(obj: dict) -> list[dict]:
    try:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path).lstrip(".")
        return [{"reason": "FieldValueInvalid", "field": field or "<root>", "message": e.message}]
    return []


def cause(field: str, message: str, reason: str = "FieldValueInvalid") -> dict:
    return {"reason": reason, "field": field, "message": message}


def meta_causes(obj: dict, resource: str) -> list[dict]:
    meta, out = obj["metadata"], []
    name = meta.get("name") or ""
    rule = DNS_1035 if resource == "services" else DNS_SUBDOMAIN
    if not name:
        out.append(cause("metadata.name", "Required value: name or generateName is required", "FieldValueRequired"))
    elif resource != "events" and (not rule.match(name) or len(name) > (63 if resource == "services" else 253)):
        what = "a DNS-1035 label" if resource == "services" else "a lowercase RFC 1123 subdomain"
        out.append(cause("metadata.name", f'Invalid value: "{name}": must be {what}'))
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, short = key.rpartition("/")
        if (prefix and not DNS_SUBDOMAIN.match(prefix)) or not short or len(short) > 63 or not LABEL_VALUE.match(short):
            out.append(cause(f"metadata.labels[{key}]", f'Invalid value: "{key}": not a qualified name'))
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            out.append(cause(f"metadata.labels[{key}]", f'Invalid value: "{value}": not a valid label value'))
    return out


def pod_causes(pod: dict) -> list[dict]:
    spec, out = pod["spec"], []
    volumes = [v.get("name") for v in spec.get("volumes") or []]
    if not spec.get("containers"):
        out.append(cause("spec.containers", "Required value", "FieldValueRequired"))
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        out.append(cause("spec.restartPolicy", f'Unsupported value: "{spec.get("restartPolicy")}"', "FieldValueNotSupported"))
    for i, v in enumerate(volumes):
        if not DNS_LABEL.match(v or "") or v in volumes[:i]:
            out.append(cause(f"spec.volumes[{i}].name", f'Invalid value: "{v}": must be a unique DNS-1123 label'))
    seen: list[str] = []
    for i, c in enumerate(spec.get("containers") or []):
        at = f"spec.containers[{i}]"
        if not DNS_LABEL.match(c.get("name") or "") or c.get("name") in seen:
            out.append(cause(f"{at}.name", f'Invalid value: "{c.get("name")}": must be a unique DNS-1123 label'))
        seen.append(c.get("name"))
        if not c.get("image"):
            out.append(cause(f"{at}.image", "Required value", "FieldValueRequired"))
        for j, m in enumerate(c.get("volumeMounts") or []):
            if m.get("name") not in volumes:
                out.append(cause(f"{at}.volumeMounts[{j}].name", f'Not found: "{m.get("name")}"', "FieldValueNotFound"))
        out += resource_causes(c.get("resources") or {}, f"{at}.resources")
    return out


def resource_causes(res: dict, at: str) -> list[dict]:
    out = []
    for name, value in (res.get("requests") or {}).items():
        limit = (res.get("limits") or {}).get(name)
        if limit is not None and quantity(value) > quantity(limit):
            out.append(cause(f"{at}.requests[{name}]", f'Invalid value: "{value}": '
                             f"must be less than or equal to {name} limit of {limit}"))
    return out


def check_quantities(obj: dict) -> None:
    """A bad quantity fails decoding (400), before any validation, as on a real server."""
    for c in (obj.get("spec") or {}).get("containers") or []:
        for kind in ("limits", "requests"):
            for value in ((c.get("resources") or {}).get(kind) or {}).values():
                if not QUANTITY.match(str(value)):
                    raise ApiError(400, "BadRequest", f'{obj.get("kind", "Pod")} in version "v1" cannot be handled as '
                                   f"a {obj.get('kind', 'Pod')}: quantities must match the regular expression "
                                   f"'{QUANTITY.pattern}'")


def secret_causes(secret: dict) -> list[dict]:
    out = []
    for key, value in secret["data"].items():
        if not re.match(r"^[-._a-zA-Z0-9]+$", key):
            out.append(cause(f"data[{key}]", f'Invalid value: "{key}": a valid config key must consist of '
                             "alphanumeric characters, '-', '_' or '.'"))
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError):
            out.append(cause(f"data[{key}]", "Invalid value: illegal base64 data"))
    return out


def validate(resource: str, obj: dict) -> None:
    """Raise 422 Invalid, naming every bad field, as a real API server does."""
    causes = meta_causes(obj, resource) + schema_causes(obj)
    if resource == "pods":
        causes += pod_causes(obj)
    elif resource == "secrets":
        causes += secret_causes(obj)
    if causes:
        text = [f"{c['field']}: {c['message']}" for c in causes]
        name, kind = obj["metadata"].get("name", ""), KINDS[resource]
        message = f'{kind} "{name}" is invalid: ' + (text[0] if len(text) == 1 else "[" + ", ".join(text) + "]")
        raise ApiError(422, "Invalid", message, {"name": name, "kind": kind, "causes": causes})


# -- selectors

def parse_labels(selector: str) -> list[tuple[str, str, set[str]]]:
    """``a=b,c!=d,!e,f,g in (x,y),h notin (z)`` as (key, operator, values)."""
    out = []
    for part in filter(None, (p.strip() for p in re.split(r",(?![^()]*\))", selector or ""))):
        m = re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", part)
        if m:
            out.append((m[1], m[2], {v.strip() for v in m[3].split(",")}))
        elif part.startswith("!"):
            out.append((part[1:], "!", set()))
        elif m := re.match(r"^([^=!]+)(==|=|!=)(.*)$", part):
            out.append((m[1].strip(), "!=" if m[2] == "!=" else "=", {m[3].strip()}))
        elif re.match(r"^[-A-Za-z0-9_./]+$", part):
            out.append((part, "exists", set()))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return out


def labels_match(labels: dict, selector: str | list) -> bool:
    reqs = parse_labels(selector) if isinstance(selector, str) else selector
    for key, op, values in reqs:
        has, value = key in labels, labels.get(key)
        ok = {"=": has and value in values, "!=": value not in values, "in": has and value in values,
              "notin": value not in values, "!": not has, "exists": has}[op]
        if not ok:
            return False
    return True


def fields_match(obj: dict, selector: str) -> bool:
    for part in filter(None, (selector or "").split(",")):
        m = re.match(r"^([^=!]+)(==|=|!=)(.*)$", part)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part!r}")
        value = obj
        for key in m[1].split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if (str(value if value is not None else "") == m[3]) == (m[2] == "!="):
            return False
    return True


def merge_patch(target, patch):
    """RFC 7386 merge patch; also used for strategic-merge patches (lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class Store:
    """All objects by resource and (namespace, name); every change bumps ``resourceVersion``, is kept
    in ``history`` for watches, and wakes whoever waits on ``cond`` (watches, the kubelet)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.objects: dict[str, dict[tuple[str, str], dict]] = {r: {} for r in KINDS}
        self.history: list[tuple[int, str, str, dict]] = []  # (resourceVersion, type, resource, object)
        self.rv = 0

    def _commit(self, resource: str, obj: dict, kind: str) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if kind == "DELETED":
            self.objects[resource].pop(key, None)
        else:
            self.objects[resource][key] = obj
        self.history.append((self.rv, kind, resource, copy.deepcopy(obj)))
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def create(self, resource: str, namespace: str, body: dict, *, check: bool = True) -> dict:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace") and namespace and meta["namespace"] != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                           "the namespace sent on the request")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        obj.setdefault("apiVersion", "v1")
        obj.setdefault("kind", KINDS[resource])
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now())
        if namespace:
            meta["namespace"] = namespace
        check_quantities(obj)
        with self.cond:
            {"pods": default_pod, "secrets": default_secret,
             "services": lambda o: default_service(o, len(self.history))}.get(resource, lambda o: None)(obj)
            if check:
                validate(resource, obj)
            if (namespace, meta["name"]) in self.objects[resource]:
                raise ApiError(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists',
                               {"name": meta["name"], "kind": resource})
            return self._commit(resource, obj, "ADDED")

    def peek(self, resource: str, namespace: str, name: str) -> dict | None:
        """The live object (do not change it), or None."""
        return self.objects[resource].get((namespace, name))

    def get(self, resource: str, namespace: str, name: str) -> dict:
        with self.cond:
            obj = self.peek(resource, namespace, name)
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def list(self, resource: str, namespace: str | None = None, labels: str = "", fields: str = "") -> list[dict]:
        reqs = parse_labels(labels)
        with self.cond:
            return [copy.deepcopy(o) for (ns, _), o in sorted(self.objects[resource].items())
                    if namespace in (None, ns) and labels_match(o["metadata"].get("labels") or {}, reqs)
                    and fields_match(o, fields)]

    def patch(self, resource: str, namespace: str, name: str, body, content_type: str) -> dict:
        if "json-patch" in content_type or not isinstance(body, dict):
            raise ApiError(415, "UnsupportedMediaType", f"the test cluster does not support {content_type} patches")
        with self.cond:
            old = self.get(resource, namespace, name)
            new = merge_patch(old, body)
            check_quantities(new)
            new["metadata"].update({k: old["metadata"][k] for k in ("name", "namespace", "uid", "creationTimestamp")})
            if "status" in old:  # status belongs to the status subresource
                new["status"] = old["status"]
            if resource == "secrets":
                default_secret(new)
            if resource == "pods" and _mutable(new["spec"]) != _mutable(old["spec"]):
                raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not '
                               "change fields other than `spec.containers[*].image`, `spec.activeDeadlineSeconds`"
                               " or `spec.tolerations` (only additions to existing tolerations)")
            validate(resource, new)
            return self._commit(resource, new, "MODIFIED")

    def update(self, resource: str, namespace: str, name: str, change, uid: str | None = None) -> dict | None:
        """Apply ``change(obj)`` to the stored object (the kubelet's status writes); None if it is gone
        (or, given ``uid``, replaced by another object of the same name)."""
        with self.cond:
            obj = self.peek(resource, namespace, name)
            if obj is None or uid not in (None, obj["metadata"]["uid"]):
                return None
            obj = copy.deepcopy(obj)
            change(obj)
            return self._commit(resource, obj, "MODIFIED")

    def delete(self, resource: str, namespace: str, name: str, uid: str | None = None) -> dict:
        with self.cond:
            obj = self.get(resource, namespace, name)
            if uid not in (None, obj["metadata"]["uid"]):
                raise not_found(resource, name)
            return self._commit(resource, obj, "DELETED")

    def namespaces(self) -> list[str]:
        with self.cond:
            seen = {ns for objs in self.objects.values() for ns, _ in objs if ns}
        return sorted(seen | {"default", "kube-system"})


def _mutable(spec: dict) -> dict:
    spec = copy.deepcopy(spec)
    for c in spec.get("containers") or []:
        c.pop("image", None)
    spec.pop("activeDeadlineSeconds", None)
    spec.pop("tolerations", None)
    return spec
