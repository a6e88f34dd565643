"""Ports for a job whose tasks must be told each other's addresses before they start (the
parameter-server job on one machine: docs/ARCHITECTURE.md, "Parameter-server training")."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
PORTS_BELOW_EPHEMERAL = 10_000  # how many ports under the ephemeral range free_ports draws from


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives to outgoing connections and to ``bind(0)`` (Linux's default
    when its setting cannot be read)."""
    try:
        low, high = (int(v) for v in Path(EPHEMERAL_RANGE).read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (held open together while choosing), drawn
    at random from the ``PORTS_BELOW_EPHEMERAL`` ports under the kernel's ephemeral range.

    A parameter-server task binds its port seconds after this choice, once TensorFlow has loaded,
    and a port of the ephemeral range (what ``bind(0)`` returns) may meanwhile go to any outgoing
    connection on the machine: CI once saw a server fail with "Could not start gRPC server" beside
    other suites.  The kernel hands out no port below that range by itself, so only a program that
    binds one explicitly can take it.  Falls back to ``bind(0)`` for what the range cannot give."""
    low = ephemeral_range()[0]
    pool = range(max(1024, low - PORTS_BELOW_EPHEMERAL), low)
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
