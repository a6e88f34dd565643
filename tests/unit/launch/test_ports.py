"""pipelines/launch/ports.py: ports chosen where no outgoing connection can take them first."""

from __future__ import annotations

import socket

from pipelines.launch import ports


def test_free_ports_come_from_below_the_ephemeral_range_and_are_free(monkeypatch, tmp_path):
    low, _ = ports.ephemeral_range()
    chosen = ports.free_ports(5)
    assert len(set(chosen)) == 5
    assert all(p < low and p in ports.draw_pool() for p in chosen)
    for p in chosen:  # each is free once chosen (the chooser's sockets are closed)
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    # a port already taken is never chosen: with a pool of one taken port, bind(0) stands in
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        setting = tmp_path / "range"
        setting.write_text(f"{taken + 1} 60999\n")
        monkeypatch.setattr(ports, "EPHEMERAL_RANGE", str(setting))
        monkeypatch.setattr(ports, "PORTS_BELOW_EPHEMERAL", 1)
        assert ports.ephemeral_range() == (taken + 1, 60999)
        (port,) = ports.free_ports(1)
        assert port != taken
    setting.write_text("not a range")
    assert ports.ephemeral_range() == (32768, 60999)  # Linux's default when unreadable


def test_free_ports_never_draw_where_a_kubernetes_try_listens(monkeypatch, tmp_path):
    """On the test cluster (pods on the host's network) a parameter-server task's port and a Horovod
    rendezvous port are hashed into fixed ranges; a test server chosen by free_ports beside them once
    took one (CI: 'Could not start gRPC server', its chief reaching an HTTP/1.x server)."""
    from pipelines.launch import k8s

    pool = ports.draw_pool()
    assert len(pool) == len(set(pool)) == ports.PORTS_BELOW_EPHEMERAL
    assert max(pool) < ports.ephemeral_range()[0] and min(pool) >= 1024
    hashed = {p for i in range(300) for p in k8s.ps_task_ports(k8s.Identity(run_id=f"r{i}"), 8)}
    hashed |= {k8s.rendezvous_port(k8s.Identity(run_id=f"r{i}")) for i in range(300)}
    assert hashed and not hashed & set(pool)
    # with Linux's default range (32768 up) the pool runs around both Kubernetes ranges
    setting = tmp_path / "range"
    setting.write_text("32768 60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", str(setting))
    pool = set(ports.draw_pool())
    assert 32767 in pool and ports.PS_PORT - 1 in pool and ports.RENDEZVOUS_PORT + ports.RENDEZVOUS_PORTS in pool
    assert not pool & set(ports.KUBERNETES_RANGES[0]) and not pool & set(ports.KUBERNETES_RANGES[1])
