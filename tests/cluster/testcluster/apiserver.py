"""The test cluster's API server: the core/v1 REST API over plain HTTP on 127.0.0.1.

TEST INFRASTRUCTURE, not product code.  The real ``kubernetes`` client and the cncf.kubernetes
provider talk to it through a kubeconfig as to any cluster.  Served: pods (create, get, list with
``labelSelector``/``fieldSelector``, ``?watch=true``, merge and strategic-merge patch, graceful
delete), ``pods/log`` (``follow`` streamed chunked, ``timestamps``, ``sinceSeconds``, ``sinceTime``,
``tailLines``, ``container``, ``previous``), services, secrets, events, persistentvolumeclaims, nodes (read-only),
namespaces (implicit: every namespace exists, unless ``declared_namespaces`` lists them) and
``selfsubjectaccessreviews`` (answered from ``rbac``, RBAC rules for the kubeconfig's user; ``None``
allows everything).  Errors are Kubernetes ``Status`` bodies.

Every request to a resource is recorded as ``(user, verb, resource[/subresource], namespace)`` in
``calls`` and in the process-wide :data:`CALLS`, the user named by the bearer token (:data:`USERS`:
``test-user`` for the kubeconfig the code under test gets, ``test-admin`` for the tests' own
client), so a test can check that the code used only what ``examples/rbac.yaml`` grants.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from testcluster.kubelet import TERMINAL, Kubelet
from testcluster.store import KINDS, ApiError, Store, fields_match, labels_match, not_found

log = logging.getLogger(__name__)
ROUTE = re.compile(r"^/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>log))?$")
CLUSTER_SCOPED = {"nodes", "namespaces"}
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
USERS = {"test-token": "test-user", "test-admin-token": "test-admin"}
CALLS: set[tuple[str, str, str, str]] = set()  # every cluster's calls in this process: (user, verb, resource, ns)


def verb_of(method: str, name: str, query: dict) -> str:
    """The RBAC verb of a request, as a real API server names it."""
    if method == "GET":
        return "get" if name else ("watch" if query.get("watch") == "True" else "list")
    return {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(method) or ("delete" if name else "deletecollection")


def rules_allow(rules: list[dict] | None, verb: str, resource: str, group: str = "") -> bool:
    """Whether RBAC ``rules`` (a Role's) allow ``verb`` on ``resource`` (``pods/log``); ``None`` allows all."""
    if rules is None:
        return True
    return any((group in r.get("apiGroups", []) or "*" in r.get("apiGroups", []))
               and (resource in r.get("resources", []) or "*" in r.get("resources", []))
               and (verb in r.get("verbs", []) or "*" in r.get("verbs", [])) for r in rules)


def stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def nano(ns: int) -> str:
    """RFC 3339 with nanoseconds, trailing zeros trimmed (Go's RFC3339Nano), as ``timestamps=true`` shows."""
    frac = f"{ns % 10**9:09d}".rstrip("0")
    return dt.datetime.fromtimestamp(ns // 10**9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def parse_time(text: str) -> int:
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    try:
        return int(dt.datetime.fromisoformat(text).timestamp() * 10**9)
    except ValueError:
        raise ApiError(400, "BadRequest", f'parsing time "{text}" as RFC3339: invalid') from None


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store: Store, kubelet: Kubelet | None = None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.store, self.kubelet = store, kubelet
        self.stopping = False
        self.rbac: list[dict] | None = None  # the kubeconfig user's rules for access reviews; None: allow all
        self.declared_namespaces: set[str] | None = None  # None: every namespace exists
        self.calls: list[tuple[str, str, str, str]] = []
        self.connections: set[socket.socket] = set()
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="apiserver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.stopping = True
        with self.store.cond:
            self.store.cond.notify_all()
        self.shutdown()
        for conn in list(self.connections):  # idle keep-alive connections end too
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiServer

    def setup(self) -> None:
        super().setup()
        self.server.connections.add(self.connection)

    def finish(self) -> None:
        self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PATCH(self):
        self.dispatch("PATCH")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def do_PUT(self):
        self.dispatch("PUT")

    def dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        query.update({k: str(query[k].lower() in ("true", "1")) for k in ("watch", "follow", "timestamps", "previous")
                      if k in query})  # the client sends Python's True
        try:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                raise ApiError(400, "BadRequest", "the request body is not JSON") from None
            if url.path in ("/api", "/api/"):
                return self.send_json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
            user = USERS.get(self.headers.get("Authorization", "").removeprefix("Bearer ").strip(), "anonymous")
            if url.path == ACCESS_REVIEWS:
                return self.access_review(method, user, body or {})
            if url.path == "/version":
                return self.send_json(200, {"major": "1", "minor": "29", "gitVersion": "v1.29.0-testcluster",
                                            "platform": "linux/amd64"})
            m = ROUTE.match(url.path)
            if not m or m["res"] not in {*KINDS, "namespaces"}:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            self.record(user, verb_of(method, m["name"] or "", query), m["res"] + (f"/{m['sub']}" if m["sub"] else ""),
                        unquote(m["ns"] or ""))
            self.route(method, m["res"], unquote(m["ns"] or ""), unquote(m["name"] or ""), m["sub"], query, body)
        except ApiError as e:
            self.send_json(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except ValueError as e:  # a query parameter that is not a number
            self.send_json(400, ApiError(400, "BadRequest", f"invalid request: {e}").status())
        except Exception as e:
            log.exception("test cluster API server failed on %s %s", method, self.path)
            self.send_json(500, ApiError(500, "InternalError", f"internal error: {e!r}").status())

    def route(self, method: str, res: str, ns: str, name: str, sub: str | None, q: dict, body) -> None:
        store = self.server.store
        if res in CLUSTER_SCOPED and ns:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if res == "namespaces" and method == "GET":
            return self.namespaces(name)
        if sub == "log" and method == "GET":
            return self.logs(ns, name, q)
        if method == "GET" and name:
            return self.send_json(200, store.get(res, ns, name))
        if method == "GET" and q.get("watch") == "True":
            return self.watch(res, ns or None, q)
        if method == "GET":
            items = store.list(res, ns or None, q.get("labelSelector", ""), q.get("fieldSelector", ""))
            return self.send_json(200, {"kind": KINDS[res] + "List", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": str(store.rv)}, "items": items})
        if method == "POST" and not name and res not in CLUSTER_SCOPED:
            return self.send_json(201, store.create(res, ns, body or {}))
        if method == "PATCH" and name:
            return self.send_json(200, store.patch(res, ns, name, body, self.headers.get("Content-Type", "")))
        if method == "DELETE" and name:
            return self.delete(res, ns, name, q, body or {})
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def record(self, user: str, verb: str, resource: str, namespace: str) -> None:
        call = (user, verb, resource, namespace)
        self.server.calls.append(call)
        CALLS.add(call)

    def access_review(self, method: str, user: str, body: dict) -> None:
        """A SelfSubjectAccessReview: may this request's user do what ``spec.resourceAttributes`` says?"""
        self.record(user, "create", "selfsubjectaccessreviews", "")
        if method != "POST":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        spec = body.get("spec") or {}
        attrs = spec.get("resourceAttributes") or {}
        resource = attrs.get("resource", "") + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
        allowed = user == "test-admin" or rules_allow(self.server.rbac, attrs.get("verb", ""), resource,
                                                      attrs.get("group", ""))
        status = {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule of the test cluster allows it"})}
        self.send_json(201, {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                             "metadata": {}, "spec": spec, "status": status})

    def namespaces(self, name: str) -> None:
        def ns_object(n: str) -> dict:
            return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": {
                "kubernetes.io/metadata.name": n}}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
        declared = self.server.declared_namespaces
        if name:
            if declared is not None and name not in declared:
                raise not_found("namespaces", name)
            return self.send_json(200, ns_object(name))
        names = sorted(declared) if declared is not None else self.server.store.namespaces()
        self.send_json(200, {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {},
                             "items": [ns_object(n) for n in names]})

    def delete(self, res: str, ns: str, name: str, q: dict, body: dict) -> None:
        """Pods on a node go gracefully (the kubelet stops them, then removes them); the rest at once."""
        store = self.server.store
        if res != "pods":
            obj = store.delete(res, ns, name)
            return self.send_json(200, obj if res == "services" else {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "kind": res, "uid": obj["metadata"]["uid"]}})
        pod = store.get(res, ns, name)
        if not pod["spec"].get("nodeName") or pod["status"].get("phase") in TERMINAL:
            return self.send_json(200, store.delete(res, ns, name))
        grace = q.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)

        def mark(p: dict) -> None:
            meta = p["metadata"]
            if meta.get("deletionGracePeriodSeconds") is None or grace < meta["deletionGracePeriodSeconds"]:
                meta.update(deletionTimestamp=stamp(time.time() + grace), deletionGracePeriodSeconds=grace)

        obj = store.update(res, ns, name, mark)
        if obj is None:
            raise not_found(res, name)
        self.send_json(200, obj)

    def logs(self, ns: str, name: str, q: dict) -> None:
        if self.server.kubelet is None:
            raise ApiError(400, "BadRequest", "this cluster has no kubelet")
        pod = self.server.store.get("pods", ns, name)
        out = self.server.kubelet.container_log(pod, q.get("container"), q.get("previous") == "True")
        lines, _ = out.after(0, 0)
        since = None
        if q.get("sinceSeconds"):
            since = time.time_ns() - int(q["sinceSeconds"]) * 10**9
        elif q.get("sinceTime"):
            since = parse_time(q["sinceTime"])
        selected = [line for line in lines if since is None or line[0] >= since]
        if q.get("tailLines") is not None:
            tail = int(q["tailLines"])
            selected = selected[-tail:] if tail > 0 else []
        ts = q.get("timestamps") == "True"

        def text(chunk: list) -> bytes:
            return b"".join((nano(t) + " ").encode() + line if ts else line for t, line in chunk)

        if q.get("follow") != "True":
            return self.send_body(200, text(selected), "text/plain")
        self.start_chunks("text/plain")
        self.write_chunk(text(selected))
        index = len(lines)
        while not self.server.stopping:
            new, done = out.after(index, 0.5)
            index += len(new)
            self.write_chunk(text(new))
            if done and not new:
                break
        self.end_chunks()

    def watch(self, res: str, ns: str | None, q: dict) -> None:
        """Watch events (one JSON object per line) from ``resourceVersion``, or ADDED for what exists."""
        store, labels, fields = self.server.store, q.get("labelSelector", ""), q.get("fieldSelector", "")
        deadline = time.time() + float(q.get("timeoutSeconds") or 1800)
        with store.cond:
            start = int(q.get("resourceVersion") or 0)
            initial = store.list(res, ns, labels, fields) if start == 0 else []
            last = store.rv if start == 0 else start
        self.start_chunks("application/json")
        self.write_chunk(b"".join(json.dumps({"type": "ADDED", "object": o}).encode() + b"\n" for o in initial))
        while not self.server.stopping and time.time() < deadline:
            with store.cond:
                if store.rv == last:
                    store.cond.wait(0.5)
                events, last = store.history[last:], store.rv  # history[i] has resourceVersion i + 1
            out = [json.dumps({"type": kind, "object": obj}).encode() + b"\n" for _, kind, r, obj in events
                   if r == res and ns in (None, obj["metadata"].get("namespace"))
                   and labels_match(obj["metadata"].get("labels") or {}, labels)
                   and fields_match(obj, fields)]
            self.write_chunk(b"".join(out))
        self.end_chunks()

    # -- replies

    def send_json(self, code: int, obj: dict) -> None:
        self.send_body(code, json.dumps(obj).encode(), "application/json")

    def send_body(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_chunks(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
