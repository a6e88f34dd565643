"""Start one container of a test-cluster pod (TEST INFRASTRUCTURE; stdlib only, run with ``python -I -S``).

The kubelet runs ``unshare --mount --uts --propagation private python pod_init.py SPEC.json``: this
script is already in the pod's own mount and UTS namespaces.  It waits for the kubelet's go (one
line on stdin, sent once the process is in its CPU cgroup), bind-mounts each volume and the pod's
``/etc/hosts`` at the paths the manifest names, sets the hostname, enters ``workingDir`` and
``exec``s the container command with the pod's environment, so the command keeps this pid.
Sources are opened before any mount, so a mount over ``/tmp`` cannot hide a source under ``/tmp``;
the "image" folders (the repository and the trainer environment) are bound back at their own paths
after the volumes, so a volume over ``/tmp`` cannot hide a checkout that lives under ``/tmp``.
A failure is written to the spec's ``error_file`` (empty on success; the exec closes it) and exits 128, as a runtime reports StartError.
"""

import ctypes
import json
import os
import socket
import stat
import sys

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384


def under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder if folder.endswith("/") else folder + "/")


def mount_all(mounts: list[dict], image: list[str] = ()) -> None:
    covered = [p for p in image if any(under(p, m["target"]) for m in mounts)]
    mounts = mounts + [{"source": p, "target": p, "readOnly": False} for p in covered]  # after the volumes
    libc = ctypes.CDLL(None, use_errno=True)
    fds = [os.open(m["source"], os.O_PATH) for m in mounts]
    dirs = [stat.S_ISDIR(os.fstat(fd).st_mode) for fd in fds]
    order = range(len(mounts) - len(covered))
    volumes = sorted(order, key=lambda i: mounts[i]["target"].rstrip("/").count("/"))
    for i in [*volumes, *range(len(volumes), len(mounts))]:
        m, fd, is_dir = mounts[i], fds[i], dirs[i]
        target = m["target"]
        if is_dir:
            os.makedirs(target, exist_ok=True)
        elif not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        flags = MS_BIND | MS_REC
        if libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, flags, None) != 0 or (
            m.get("readOnly") and libc.mount(None, target.encode(), None, flags | MS_REMOUNT | MS_RDONLY, None)
        ):
            raise OSError(ctypes.get_errno(), f"mount {m['source']} at {target}: {os.strerror(ctypes.get_errno())}")
        os.close(fd)


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    sys.stdin.buffer.readline()
    spec["error_fd"] = os.open(spec["error_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # before /tmp is covered
    argv = spec["argv"]
    try:
        mount_all(spec["mounts"], spec.get("image", []))
        socket.sethostname(spec["hostname"])
        if spec.get("workingDir"):
            os.makedirs(spec["workingDir"], exist_ok=True)
            os.chdir(spec["workingDir"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    except OSError as e:
        fail(spec, f"failed to create containerd task: {e}")
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as e:
        missing = isinstance(e, FileNotFoundError) and "/" not in argv[0]
        fail(spec, f'exec: "{argv[0]}": executable file not found in $PATH' if missing else f"exec: {e}")


def fail(spec: dict, message: str) -> None:
    os.write(spec["error_fd"], message.encode())
    print(message, file=sys.stderr, flush=True)
    os._exit(128)

if __name__ == "__main__":
    main(sys.argv[1])
