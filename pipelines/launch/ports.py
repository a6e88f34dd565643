"""The ports this project's jobs listen on, in one plan (docs/ARCHITECTURE.md, "Launchers"):

- on Kubernetes, a try's ports are hashed from the try into two fixed ranges,
  ``PS_PORT .. + PS_PORTS - 1`` (the parameter-server tasks) and
  ``RENDEZVOUS_PORT .. + RENDEZVOUS_PORTS - 1`` (Horovod rank 0's rendezvous).  On a pod network
  a fixed port would do; where pods share the host's network (``hostNetwork``, the project's test
  cluster) the hash keeps concurrent tries apart;
- on one machine, :func:`free_ports` chooses ports for a job whose tasks must know each other's
  addresses before they start (the local parameter-server job), and for test servers.  It never
  draws from the Kubernetes ranges nor from the kernel's ephemeral range.

CI once saw a parameter-server pod of the test cluster fail with "Could not start gRPC server"
(and its chief reach an HTTP/1.x server at its address) because a test deployment beside it had
taken a port of ``PS_PORT``'s range through :func:`free_ports`: the two choices share one network
there, so they are disjoint by construction."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
PORTS_BELOW_EPHEMERAL = 10_000  # how many ports under the ephemeral range free_ports draws from

PS_PORT = 22200  # a Kubernetes parameter-server try's tasks listen in PS_PORT .. + PS_PORTS - 1
PS_PORTS = 6000
RENDEZVOUS_PORT = 29400  # a Kubernetes Horovod try's rank 0 listens in RENDEZVOUS_PORT .. + RENDEZVOUS_PORTS - 1
RENDEZVOUS_PORTS = 100
KUBERNETES_RANGES = (range(PS_PORT, PS_PORT + PS_PORTS), range(RENDEZVOUS_PORT, RENDEZVOUS_PORT + RENDEZVOUS_PORTS))


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives to outgoing connections and to ``bind(0)`` (Linux's default
    when its setting cannot be read)."""
    try:
        low, high = (int(v) for v in Path(EPHEMERAL_RANGE).read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def draw_pool() -> list[int]:
    """The ``PORTS_BELOW_EPHEMERAL`` highest ports under the ephemeral range (and above 1023)
    outside ``KUBERNETES_RANGES``: where :func:`free_ports` draws."""
    pool: list[int] = []
    port = ephemeral_range()[0] - 1
    while port >= 1024 and len(pool) < PORTS_BELOW_EPHEMERAL:
        if not any(port in r for r in KUBERNETES_RANGES):
            pool.append(port)
        port -= 1
    return pool


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (held open together while choosing), drawn
    at random from :func:`draw_pool`.

    A parameter-server task binds its port seconds after this choice, once TensorFlow has loaded,
    and a port of the ephemeral range (what ``bind(0)`` returns) may meanwhile go to any outgoing
    connection on the machine: CI once saw a server fail with "Could not start gRPC server" beside
    other suites.  The kernel hands out no port below that range by itself, so only a program that
    binds one explicitly can take it.  Falls back to ``bind(0)`` for what the pool cannot give."""
    pool = draw_pool()
    socks: list[socket.socket] = []
    try:
        for port in random.sample(pool, len(pool)):
            if len(socks) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken (or in TIME_WAIT): the next one
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
