"""The Gloo rendezvous and the environment every Horovod rank needs.

Horovod's Gloo controller finds its peers through an HTTP key-value server (the rendezvous) and
reads its place in the job from ``HOROVOD_*`` environment variables.  ``horovodrun`` sets both up
for local processes or ssh; this module does the same for our local launcher and for Kubernetes
pods (where rank 0 hosts the rendezvous and the others reach it through a headless Service).

Horovod is imported only inside :func:`start_rendezvous`.
"""

from __future__ import annotations

import dataclasses
import os

from pipelines.launch.ports import RENDEZVOUS_PORT  # Kubernetes' default; the local launcher picks a free one

# Our own variables, next to Horovod's.
ENV_DEVICE = "HETERO_DEVICE_TYPE"  # device type name from the pool
ENV_BATCH = "HETERO_LOCAL_BATCH"  # this rank's planned local batch
ENV_THREADS = "HETERO_CPU_THREADS"  # threads TensorFlow may use (matches the CPU quota)
ENV_SHARE = "HETERO_CPU_SHARE"  # the rank's CPU quota in cores (a pod's CPU limit), if it has one
ENV_HOST_RENDEZVOUS = "HETERO_HOST_RENDEZVOUS"  # "1": this rank starts the rendezvous server


@dataclasses.dataclass(frozen=True)
class Slot:
    """One rank's place: global rank and size, and its position on its host."""

    rank: int
    size: int
    hostname: str = "localhost"
    local_rank: int | None = None
    local_size: int | None = None
    cross_rank: int = 0
    cross_size: int = 1

    def env(self) -> dict[str, str]:
        local_rank = self.rank if self.local_rank is None else self.local_rank
        local_size = self.size if self.local_size is None else self.local_size
        return {
            "HOROVOD_HOSTNAME": self.hostname,
            "HOROVOD_RANK": str(self.rank),
            "HOROVOD_SIZE": str(self.size),
            "HOROVOD_LOCAL_RANK": str(local_rank),
            "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(self.cross_rank),
            "HOROVOD_CROSS_SIZE": str(self.cross_size),
        }


def local_slots(n: int, hostname: str = "localhost") -> list[Slot]:
    """N ranks on one host."""
    return [Slot(rank=r, size=n, hostname=hostname, local_rank=r, local_size=n) for r in range(n)]


def pod_slots(n: int) -> list[Slot]:
    """N ranks, one per pod (each pod is its own host)."""
    return [Slot(rank=r, size=n, hostname=f"rank-{r}", local_rank=0, local_size=1, cross_rank=r, cross_size=n) for r in range(n)]


def gloo_env(addr: str, port: int, iface: str = "lo") -> dict[str, str]:
    """Variables that point a rank at the rendezvous and select Gloo for control and tensors."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
    }


def start_rendezvous(slots: list[Slot], port: int = 0, host: str = "0.0.0.0"):
    """Start Horovod's rendezvous HTTP server in a thread; returns ``(server, port)``.

    ``port=0`` picks a free port.  Call ``server.shutdown()`` when the job ends.
    """
    import threading

    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer((host, port), RendezvousHandler, 0)
    plan = []
    for s in slots:
        e = s.env()
        plan.append(
            SlotInfo(
                hostname=s.hostname,
                rank=s.rank,
                local_rank=int(e["HOROVOD_LOCAL_RANK"]),
                cross_rank=s.cross_rank,
                size=s.size,
                local_size=int(e["HOROVOD_LOCAL_SIZE"]),
                cross_size=s.cross_size,
            )
        )
    server.init(plan)
    thread = threading.Thread(target=server.serve_forever, name="gloo-rendezvous", daemon=True)
    thread.start()
    return server, server.server_address[1]


def maybe_host_rendezvous() -> object | None:
    """In a pod: if this rank is asked to host the rendezvous, start it on the fixed port."""
    if os.environ.get(ENV_HOST_RENDEZVOUS) != "1":
        return None
    size = int(os.environ["HOROVOD_SIZE"])
    port = int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", RENDEZVOUS_PORT))
    server, _ = start_rendezvous(pod_slots(size), port=port)
    return server
