"""The test cluster's kubelet: every bound pod's containers run as real local processes.

TEST INFRASTRUCTURE, not product code.  What it does as a kubelet does:

* status: ``Pending`` (container waiting ``ContainerCreating``) -> ``Running`` (``startedAt``, ready,
  ``podIP``) -> ``Succeeded``/``Failed`` (terminated ``exitCode``, ``Completed``/``Error``, times);
  ``restartPolicy`` ``OnFailure``/``Always`` restart with a (short) ``CrashLoopBackOff``;
* environment: ``env`` (values, ``$(VAR)``, ``secretKeyRef``, ``fieldRef``), ``envFrom``
  ``secretRef``, service links; a missing Secret leaves the container waiting
  ``CreateContainerConfigError`` until it appears;
* volumes, bind-mounted at their ``mountPath`` in a private mount namespace (``pod_init.py``):
  ``persistentVolumeClaim`` -> one folder per claim under ``<root>/claims``, ``emptyDir`` -> a fresh
  folder per pod, ``secret`` -> files, ``hostPath``; plus a generated ``/etc/hosts`` in which every
  Service name, the hostnames of a headless Service's pods and the pod's own name are 127.0.0.1;
* the "image" is the trainer environment: ``python`` on ``PATH`` (a wrapper in
  ``/run/testcluster/<id>/bin``, removed at stop) runs the configured interpreter and ``PYTHONPATH``
  holds the repository root;
* ``limits.cpu`` becomes a CFS quota on the container's own cgroup (``pipelines.launch.cgroups``).
  Where no cgroup can be written, the container runs UNTHROTTLED (a real kubelet would fail it):
  every such limit is logged as a warning and kept in ``Kubelet.unenforced_cpu_limits``, and
  ``TestCluster.cpu_limits_enforced`` is False, so a test that needs a slow pod skips or fails;
* logs: stdout and stderr with a timestamp per line, for ``pods/log``;
* deletion: SIGTERM to the process group, SIGKILL after the grace period, then the object goes.

Limits of the imitation: all pods share the host network (a pod's port is 127.0.0.1:<port>, so a
Service's ``port`` must equal its ``targetPort``) and the host's root filesystem: only volumes are
private, a missing ``mountPath`` is created (empty) on the host, and what a pod writes elsewhere
lands on the host.  ``securityContext`` (users, read-only root) and memory limits are not applied;
processes that leave their process group (``setsid``) are not tracked.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pipelines.launch.cgroups import CGROUP_ROOT, CpuLimiter
from testcluster import scheduler
from testcluster.store import ApiError, Store, labels_match, now, quantity

log = logging.getLogger(__name__)
POD_INIT = Path(__file__).with_name("pod_init.py")
IMAGE_ROOT = Path("/run/testcluster")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TERMINAL = ("Succeeded", "Failed")


class ConfigError(Exception):
    """The container cannot be configured yet (``reason``: the waiting reason a kubelet shows)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class ContainerLog:
    """One container instance's output: ``(unix ns, line)`` pairs, and whether it has ended."""

    def __init__(self):
        self.lines: list[tuple[int, bytes]] = []
        self.done = False
        self.cond = threading.Condition()

    def append(self, line: bytes) -> None:
        with self.cond:
            self.lines.append((time.time_ns(), line if line.endswith(b"\n") else line + b"\n"))
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def after(self, start: int, timeout: float) -> tuple[list[tuple[int, bytes]], bool]:
        """Lines from index ``start`` (waiting up to ``timeout`` for some), and whether that is all."""
        with self.cond:
            if len(self.lines) <= start and not self.done:
                self.cond.wait(timeout)
            return self.lines[start:], self.done


class Kubelet:
    """Schedules pending pods and runs a :class:`PodWorker` per bound pod, from one control loop."""

    def __init__(self, store: Store, root: Path, *, python: str, repo_root: Path, api_port: int,
                 image_env: dict | None = None, restart_backoff_s: float = 1.0, cpu_limits: bool = True,
                 cgroup_root: Path | None = None):
        self.store, self.root, self.api_port = store, root, api_port
        self.repo_root, self.image_env, self.restart_backoff_s = repo_root, dict(image_env or {}), restart_backoff_s
        # The "image" lives outside the cluster root: a pod's emptyDir over /tmp must not hide its python.
        self.image_dir = IMAGE_ROOT / f"{os.getpid()}-{id(self):x}"
        self.bin_dir = self.image_dir / "bin"
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for name in ("python", "python3"):  # a wrapper, not a link: a venv's python must run at its own path
            (self.bin_dir / name).write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
            (self.bin_dir / name).chmod(0o755)
        # The image's own folders (the code and the trainer environment): kept visible in pods even
        # where a volume covers them (a checkout under /tmp and a pod's emptyDir at /tmp).
        self.image_paths = sorted({str(repo_root), str(Path(python).parent.parent)})
        self.workers: dict[str, PodWorker] = {}
        self.logs: dict[tuple[str, str], list[ContainerLog]] = {}  # (pod uid, container) -> instances
        self.pids: set[int] = set()
        job = f"test-cluster-{os.getpid()}-{id(self):x}"
        self.limiter = CpuLimiter(job, cgroup_root or CGROUP_ROOT) if cpu_limits else None
        self.unenforced_cpu_limits: list[str] = []  # "<pod group>: <cores> CPU (why)" for each limit not applied
        self.cgroup_lock = threading.Lock()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Kill every pod's processes, wait for them, remove the cgroups."""
        self.stopping = True
        with self.store.cond:
            self.store.cond.notify_all()
        self.thread.join(10)
        for worker in list(self.workers.values()):
            worker.join(15)
        if self.limiter is not None:
            self.limiter.cleanup()
        shutil.rmtree(self.image_dir, ignore_errors=True)

    def claim_path(self, namespace: str, claim: str) -> Path:
        return self.root / "claims" / namespace / claim

    def _loop(self) -> None:
        seen = -1
        while not self.stopping:
            with self.store.cond:
                if self.store.rv == seen:
                    self.store.cond.wait(0.2)
                seen = self.store.rv
            try:
                self.sync()
            except Exception:
                log.exception("kubelet sync failed")

    def sync(self) -> None:
        pods = sorted(self.store.list("pods"), key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        nodes = self.store.list("nodes")
        for pod in pods:
            meta, spec, uid = pod["metadata"], pod["spec"], pod["metadata"]["uid"]
            worker = self.workers.get(uid)
            if meta.get("deletionTimestamp") and (worker is None or not worker.is_alive()):
                self.remove(pod)
            elif not spec.get("nodeName") and not meta.get("deletionTimestamp"):
                self.schedule(pod, nodes, pods)
            elif spec.get("nodeName") and worker is None and pod["status"].get("phase") not in TERMINAL:
                self.workers[uid] = PodWorker(self, pod)
                self.workers[uid].start()
        live = {p["metadata"]["uid"] for p in pods}
        for key in [k for k in list(self.logs) if k[0] not in live]:
            del self.logs[key]
        for uid in [u for u, w in self.workers.items() if u not in live and not w.is_alive()]:
            del self.workers[uid]
        services = self.store.list("services")
        for worker in [w for w in self.workers.values() if w.is_alive()]:
            worker.write_hosts(hosts_file(worker.pod, services, pods))

    def remove(self, pod: dict) -> None:
        try:
            self.store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"])
        except ApiError:
            pass  # already gone

    def schedule(self, pod: dict, nodes: list[dict], pods: list[dict]) -> None:
        meta = pod["metadata"]
        node, why = scheduler.place(pod, nodes, pods)
        if node:
            def bind(p: dict) -> None:
                p["spec"]["nodeName"] = node
                p["status"]["conditions"] = [condition("PodScheduled", "True")]
            if self.store.update("pods", meta["namespace"], meta["name"], bind, uid=meta["uid"]):
                pod["spec"]["nodeName"] = node  # counts against the node for the pods after it
                self.event(pod, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} "
                           f"to {node}", "default-scheduler")
            return
        old = next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {})
        if old.get("message") != why:
            self.store.update("pods", meta["namespace"], meta["name"], lambda p: p["status"].update(
                conditions=[condition("PodScheduled", "False", "Unschedulable", why)]), uid=meta["uid"])
            self.event(pod, "Warning", "FailedScheduling", why, "default-scheduler")

    def event(self, pod: dict, kind: str, reason: str, message: str, component: str = "kubelet",
              container: str | None = None) -> None:
        meta, stamp = pod["metadata"], now()
        ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
               "uid": meta["uid"], "resourceVersion": meta.get("resourceVersion")}
        if container:
            ref["fieldPath"] = f"spec.containers{{{container}}}"
        node = pod["spec"].get("nodeName")
        self.store.create("events", meta["namespace"], {
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}"}, "involvedObject": ref,
            "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": stamp,
            "lastTimestamp": stamp, "source": {"component": component, **({"host": node} if node else {})},
            "reportingComponent": component, "reportingInstance": node or ""}, check=False)

    def container_log(self, pod: dict, container: str | None, previous: bool) -> ContainerLog:
        """The log a ``pods/log`` request reads, or the 400 a kubelet answers."""
        names = [c["name"] for c in pod["spec"]["containers"]]
        name = pod["metadata"]["name"]
        if container is None:
            if len(names) > 1:
                raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}, "
                               f"choose one of: [{' '.join(names)}]")
            container = names[0]
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        instances = self.logs.get((pod["metadata"]["uid"], container), [])
        if previous:
            if len(instances) < 2:
                raise ApiError(400, "BadRequest", f'previous terminated container "{container}" in pod "{name}" not found')
            return instances[-2]
        if not instances:
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: '
                           "ContainerCreating")
        return instances[-1]

    def limit_cpu(self, pid: int, group: str, cores: float) -> None:
        if self.limiter is None:  # limits switched off for this cluster on purpose (cpu_limits=False)
            return
        with self.cgroup_lock:
            if self.limiter.limit(pid, group, cores):
                return
            self.unenforced_cpu_limits.append(f"{group}: {cores:g} CPU ({self.limiter.warning})")
        log.warning("test cluster: limits.cpu %g of %s is NOT enforced, the container runs unthrottled: %s",
                    cores, group, self.limiter.warning)


def condition(kind: str, status: str, reason: str | None = None, message: str | None = None) -> dict:
    out = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": now()}
    return {**out, **({"reason": reason} if reason else {}), **({"message": message} if message else {})}


def hostname(pod: dict) -> str:
    return (pod["spec"].get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


def hosts_file(pod: dict, services: list[dict], pods: list[dict]) -> str:
    """The pod's /etc/hosts: what cluster DNS would answer, all on 127.0.0.1 (the pods' shared network)."""
    ns, spec, me = pod["metadata"]["namespace"], pod["spec"], hostname(pod)
    own = [me] + ([f"{me}.{spec['subdomain']}.{ns}.svc.cluster.local"] if spec.get("subdomain") else [])
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", "127.0.0.1\t" + " ".join(own)]
    for svc in services:
        name, sns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        names = ([name] if sns == ns else []) + [f"{name}.{sns}", f"{name}.{sns}.svc", f"{name}.{sns}.svc.cluster.local"]
        lines.append("127.0.0.1\t" + " ".join(names))
        if svc["spec"].get("clusterIP") != "None":
            continue
        selector = [(k, "=", {v}) for k, v in (svc["spec"].get("selector") or {}).items()]
        for p in pods:
            if (p["metadata"]["namespace"] == sns and p["spec"].get("subdomain") == name and p["spec"].get("hostname")
                    and selector and labels_match(p["metadata"].get("labels") or {}, selector)):
                short = f"{p['spec']['hostname']}.{name}"
                local = [short] if sns == ns else []  # the search path's names
                lines.append("127.0.0.1\t" + " ".join(local + [f"{short}.{sns}{s}" for s in ("", ".svc", ".svc.cluster.local")]))
    return "\n".join(lines) + "\n"


def expand(text: str, env: dict) -> str:
    """Kubernetes' ``$(VAR)`` references (``$$`` escapes); unknown ones stay as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


class PodWorker(threading.Thread):
    """Runs one pod on its node: volumes, containers (restarts), status, deletion."""

    def __init__(self, kubelet: Kubelet, pod: dict):
        super().__init__(name=f"pod-{pod['metadata']['name']}", daemon=True)
        self.kubelet, self.pod = kubelet, pod
        self.ns, self.name, self.uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        self.dir = kubelet.root / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.hosts = self.dir / "etc-hosts"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hosts.write_text(hosts_file(pod, [], []))
        self.volumes: dict[str, tuple[Path, bool]] = {}
        self.c = {c["name"]: {"spec": c, "proc": None, "state": {"waiting": {"reason": "ContainerCreating"}},
                              "lastState": {}, "restartCount": 0, "next_try": 0.0, "reported": None}
                  for c in pod["spec"]["containers"]}

    def write_hosts(self, text: str) -> None:
        if self.hosts.read_text() != text:
            with open(self.hosts, "r+") as f:  # in place: the bind mount follows the inode
                f.truncate(0)
                f.write(text)

    def live(self) -> dict | None:
        return self.kubelet.store.peek("pods", self.ns, self.name)

    def deletion(self) -> float | None:
        """The grace period (s) if the pod is being deleted (or the cluster stops), else None."""
        if self.kubelet.stopping:
            return 0.0
        pod = self.live()
        if pod is None or pod["metadata"].get("uid") != self.uid:
            return 0.0
        if pod["metadata"].get("deletionTimestamp"):
            return float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        return None

    def run(self) -> None:
        try:
            self.publish()
            if self.mount_volumes():
                self.run_containers()
        except Exception:
            log.exception("pod %s/%s: kubelet worker failed", self.ns, self.name)
            self.kill(0)
        finally:
            if self.deletion() is not None:
                self.kubelet.remove(self.pod)

    def mount_volumes(self) -> bool:
        """Prepare the pod's volumes, retrying while a Secret is missing; False if deleted meanwhile."""
        reported = None
        while self.deletion() is None:
            try:
                self.volumes = {v["name"]: self.volume(v) for v in self.pod["spec"].get("volumes") or []}
                return True
            except ConfigError as e:
                if str(e) != reported:
                    reported = str(e)
                    self.kubelet.event(self.pod, "Warning", "FailedMount", str(e))
            time.sleep(0.5)
        return False

    def volume(self, v: dict) -> tuple[Path, bool]:
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]
            path = self.kubelet.claim_path(self.ns, claim["claimName"])
            path.mkdir(parents=True, exist_ok=True)
            return path, bool(claim.get("readOnly"))
        if "hostPath" in v:
            return Path(v["hostPath"]["path"]), False
        path = self.dir / "volumes" / v["name"]
        path.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in v:
            return path, False
        if "secret" in v:
            src = v["secret"]
            data = self.secret(src["secretName"], src.get("optional"), f'MountVolume.SetUp failed for volume "{v["name"]}" : ')
            items = src.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] not in data:
                    raise ConfigError("ContainerCreating", f'MountVolume.SetUp failed for volume "{v["name"]}" : '
                                      f'references non-existent secret key: {item["key"]}')
                (path / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (path / item["path"]).write_bytes(data[item["key"]])
                (path / item["path"]).chmod(item.get("mode", src.get("defaultMode", 0o644)))
            return path, True
        raise ConfigError("ContainerCreating", f'MountVolume.SetUp failed for volume "{v["name"]}" : '
                          "volume type not supported by the test cluster")

    def secret(self, name: str, optional: bool | None, prefix: str = "") -> dict[str, bytes]:
        secret = self.kubelet.store.peek("secrets", self.ns, name)
        if secret is None:
            if optional:
                return {}
            raise ConfigError("CreateContainerConfigError", f'{prefix}secret "{name}" not found')
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    def env(self, c: dict) -> dict[str, str]:
        """The container's environment: the image's, service links, ``envFrom``, then ``env``."""
        k = self.kubelet
        env = {"PATH": f"{k.bin_dir}:{BASE_PATH}", "HOSTNAME": hostname(self.pod), "HOME": "/root",
               "LANG": "C.UTF-8", "PYTHONPATH": str(k.repo_root), "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(k.api_port), **k.image_env}
        if self.pod["spec"].get("enableServiceLinks", True):
            for svc in k.store.list("services", self.ns):
                prefix = svc["metadata"]["name"].upper().replace("-", "_")
                if svc["spec"].get("clusterIP") != "None" and svc["spec"].get("ports"):
                    env[f"{prefix}_SERVICE_HOST"] = "127.0.0.1"
                    env[f"{prefix}_SERVICE_PORT"] = str(svc["spec"]["ports"][0]["port"])
        for src in c.get("envFrom") or []:
            if "secretRef" in src:
                for key, value in self.secret(src["secretRef"]["name"], src["secretRef"].get("optional")).items():
                    env[src.get("prefix", "") + key] = value.decode()
            else:
                ref = src.get("configMapRef") or {}
                if not ref.get("optional"):
                    raise ConfigError("CreateContainerConfigError", f'configmap "{ref.get("name")}" not found')
        for e in c.get("env") or []:
            env[e["name"]] = self.env_value(e, env)
        return env

    def env_value(self, e: dict, env: dict) -> str:
        src = e.get("valueFrom")
        if not src:
            return expand(e.get("value") or "", env)
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            data = self.secret(ref["name"], ref.get("optional"))
            if ref["key"] not in data and not ref.get("optional"):
                raise ConfigError("CreateContainerConfigError", f"couldn't find key {ref['key']} in Secret {self.ns}/{ref['name']}")
            return data.get(ref["key"], b"").decode()
        if "fieldRef" in src:
            path, meta = src["fieldRef"]["fieldPath"], self.pod["metadata"]
            m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
            if m:
                return (meta.get(m[1]) or {}).get(m[2], "")
            return {"metadata.name": self.name, "metadata.namespace": self.ns, "metadata.uid": self.uid,
                    "spec.nodeName": self.pod["spec"].get("nodeName", ""), "status.podIP": "127.0.0.1",
                    "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
                    "status.hostIP": "127.0.0.1", "status.podIPs": "127.0.0.1"}.get(path, "")
        raise ConfigError("CreateContainerConfigError", f"env {e['name']}: only value, secretKeyRef and fieldRef "
                          "are supported by the test cluster")

    def run_containers(self) -> None:
        """Start, watch and restart the containers until they are all done or the pod is deleted."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        while True:
            grace = self.deletion()
            if grace is not None:
                self.kill(grace)
                return
            changed = False
            for name, st in self.c.items():
                if st["proc"] is None and st["next_try"] is not None and time.time() >= st["next_try"]:
                    changed |= self.try_start(name, st)
                elif st["proc"] is not None and exited(st["proc"]):
                    self.finish(name, st, policy)
                    changed = True
            if changed:
                self.publish()
            if all(st["next_try"] is None and st["proc"] is None for st in self.c.values()):
                return
            time.sleep(0.05)

    def try_start(self, name: str, st: dict) -> bool:
        c = st["spec"]
        try:
            env = self.env(c)
        except ConfigError as e:
            st.update(state={"waiting": {"reason": e.reason, "message": str(e)}}, next_try=time.time() + 1)
            if st["reported"] != str(e):
                st["reported"] = str(e)
                self.kubelet.event(self.pod, "Warning", "Failed", f"Error: {e}", container=name)
                return True
            return False
        self.kubelet.event(self.pod, "Normal", "Pulled", f'Container image "{c["image"]}" already present on machine', container=name)
        try:
            self.launch(name, st, env)
        except OSError as e:  # no unshare, no fork: as a runtime that cannot start the task
            term = {"exitCode": 128, "reason": "StartError", "message": str(e), "startedAt": now(), "finishedAt": now()}
            st.update(state={"terminated": term}, next_try=None)
            return True
        self.kubelet.event(self.pod, "Normal", "Started", f"Started container {name}", container=name)
        return True

    def launch(self, name: str, st: dict, env: dict) -> None:
        c, n = st["spec"], st["restartCount"]
        argv = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        mounts = [{"source": str(self.hosts), "target": "/etc/hosts"}]
        for m in c.get("volumeMounts") or []:
            source, read_only = self.volumes[m["name"]]
            if m.get("subPath"):
                source = source / m["subPath"]
                source.mkdir(parents=True, exist_ok=True)
            mounts.append({"source": str(source), "target": m["mountPath"], "readOnly": read_only or bool(m.get("readOnly"))})
        error_file = self.dir / f"{name}.{n}.error"
        spec = {"argv": argv or ["/bin/false"], "env": env, "mounts": mounts, "workingDir": c.get("workingDir"),
                "hostname": hostname(self.pod), "error_file": str(error_file), "image": self.kubelet.image_paths}
        (self.dir / f"{name}.{n}.json").write_text(json.dumps(spec))
        unshare = shutil.which("unshare") or "unshare"
        proc = subprocess.Popen([unshare, "--mount", "--uts", "--propagation", "private", sys.executable, "-I", "-S",
                                 str(POD_INIT), str(self.dir / f"{name}.{n}.json")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd="/")
        self.kubelet.pids.add(proc.pid)
        cpu = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
        if cpu is not None:
            self.kubelet.limit_cpu(proc.pid, self.group(name, n), quantity(cpu))
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        out = ContainerLog()
        self.kubelet.logs.setdefault((self.uid, name), []).append(out)
        reader = threading.Thread(target=lambda: [out.append(line) for line in proc.stdout], daemon=True)
        reader.start()
        st.update(proc=proc, reader=reader, log=out, next_try=None, reported=None, error_file=error_file,
                  state={"running": {"startedAt": now()}})

    def group(self, name: str, n: int) -> str:
        return f"{self.ns}_{self.name}_{name}_{n}"

    def finish(self, name: str, st: dict, policy: str) -> None:
        """Record a container's exit (code as a kubelet reports it) and restart it if the policy says so."""
        proc = st["proc"]
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a container ends with its main process: so do its children
        except ProcessLookupError:
            pass
        code = proc.wait()
        code = 128 - code if code < 0 else code
        wait_group_gone(proc.pid)
        st["reader"].join(5)
        st["log"].finish()
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "startedAt": st["state"]["running"]["startedAt"], "finishedAt": now(),
                "containerID": f"containerd://{self.uid.replace('-', '')}{name}"}
        if st["error_file"].exists() and st["error_file"].stat().st_size:
            term.update(reason="StartError", message=st["error_file"].read_text())
        elif code and st["spec"].get("terminationMessagePolicy") == "FallbackToLogsOnError":
            term["message"] = b"".join(line for _, line in st["log"].lines[-80:])[-2048:].decode(errors="replace")
        st["proc"] = None
        if self.deletion() is None and (policy == "Always" or (policy == "OnFailure" and code != 0)):
            backoff = min(self.kubelet.restart_backoff_s * 2 ** st["restartCount"], 300)
            st.update(lastState={"terminated": term}, restartCount=st["restartCount"] + 1, next_try=time.time() + backoff,
                      state={"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off {backoff:g}s restarting "
                                         f"failed container={name} pod={self.name}_{self.ns}({self.uid})"}})
        else:
            st.update(state={"terminated": term}, next_try=None)

    def kill(self, grace: float) -> None:
        """SIGTERM every running container's process group, SIGKILL after ``grace`` seconds."""
        running = {n: st for n, st in self.c.items() if st["proc"] is not None}
        for name, st in running.items():
            self.kubelet.event(self.pod, "Normal", "Killing", f"Stopping container {name}", container=name)
            signal_group(st["proc"].pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.time() + grace
        while time.time() < deadline and not all(exited(st["proc"]) for st in running.values()):
            time.sleep(0.05)
        for name, st in running.items():
            self.finish(name, st, "Never")
        for st in self.c.values():
            st["next_try"] = None
        self.publish()

    def publish(self) -> None:
        """Write the pod's status as a kubelet reports it."""
        states = [st["state"] for st in self.c.values()]
        if any("running" in s for s in states):
            phase = "Running"
        elif all("terminated" in s for s in states):
            phase = "Succeeded" if all(s["terminated"]["exitCode"] == 0 for s in states) else "Failed"
        else:
            phase = "Running" if any(st["restartCount"] for st in self.c.values()) else "Pending"
        ready = all("running" in s for s in states)
        why = None if ready else ("PodCompleted" if phase in TERMINAL else "ContainersNotReady")
        statuses = [{"name": n, "image": st["spec"]["image"], "imageID": f"local://{st['spec']['image']}",
                     "containerID": f"containerd://{self.uid.replace('-', '')}{n}", "ready": "running" in st["state"],
                     "started": "running" in st["state"], "restartCount": st["restartCount"],
                     "state": st["state"], "lastState": st["lastState"]} for n, st in self.c.items()]
        conditions = [condition("PodReadyToStartContainers", "True"), condition("Initialized", "True"),
                      condition("Ready", str(ready), why), condition("ContainersReady", str(ready), why),
                      condition("PodScheduled", "True")]

        def write(pod: dict) -> None:
            pod["status"].update(phase=phase, conditions=conditions, containerStatuses=statuses, hostIP="127.0.0.1",
                                 hostIPs=[{"ip": "127.0.0.1"}], podIP="127.0.0.1", podIPs=[{"ip": "127.0.0.1"}])
            pod["status"].setdefault("startTime", now())

        self.kubelet.store.update("pods", self.ns, self.name, write, uid=self.uid)


def exited(proc: subprocess.Popen) -> bool:
    """Whether the process has exited, without reaping it (its group can still be signalled)."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def wait_group_gone(pgid: int, timeout: float = 5.0) -> None:
    """Wait until no process of the group is left alive (zombies awaiting init's reaping are dead)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not group_members(pgid):
            return
        time.sleep(0.02)
    log.warning("processes of group %s outlived their container", pgid)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":
            out.append(int(entry))
    return out
