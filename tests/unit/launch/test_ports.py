"""pipelines/launch/ports.py: ports chosen where no outgoing connection can take them first."""

from __future__ import annotations

import socket

from pipelines.launch import ports


def test_free_ports_come_from_below_the_ephemeral_range_and_are_free(monkeypatch, tmp_path):
    low, _ = ports.ephemeral_range()
    chosen = ports.free_ports(5)
    assert len(set(chosen)) == 5
    assert all(max(1024, low - ports.PORTS_BELOW_EPHEMERAL) <= p < low for p in chosen)
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
