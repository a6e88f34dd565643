"""The local launcher's pieces: a rank's environment, starting a rank in its profile, the failure
message, the --profiles parser.  The whole launcher runs in tests/integration/trainer/test_launcher.py."""

from __future__ import annotations

import signal
import sys
import threading

import pytest

from pipelines.launch.local import (
    Profile,
    _stop_on_signals,
    failure_message,
    parse_profiles,
    rank_env,
    start_rank,
)


def test_rank_env_places_the_rank_and_points_it_at_the_rendezvous():
    env = rank_env(1, 3, 4567, Profile(device="slow", cpus=(0, 1), cpu_share=1.5), base={"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"]) == ("1", "3", "1")
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1" and env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4567"
    assert env["HOROVOD_CONTROLLER"] == "gloo" and env["HOROVOD_GLOO_IFACE"] == "lo"
    assert env["HETERO_DEVICE_TYPE"] == "slow" and env["HETERO_CPU_SHARE"] == "1.5"
    assert env["HETERO_CPU_THREADS"] == env["OMP_NUM_THREADS"] == "2"  # the quota rounded up
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "120" and env["PYTHONUNBUFFERED"] == "1"


def test_rank_env_without_a_share_sets_no_threads_and_keeps_the_callers_settings():
    env = rank_env(0, 1, 1, Profile(), base={"HOROVOD_GLOO_TIMEOUT_SECONDS": "5", "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert env["HETERO_DEVICE_TYPE"] == "default"
    assert not {"HETERO_CPU_SHARE", "HETERO_CPU_THREADS", "OMP_NUM_THREADS"} & set(env)
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "5" and env["TF_CPP_MIN_LOG_LEVEL"] == "0"


class FakeLimiter:
    def __init__(self, ok: bool):
        self.ok, self.calls = ok, []

    def limit(self, pid, name, cpu_share, cpus, period_us):
        self.calls.append((name, cpu_share, cpus, period_us))
        return self.ok


def _started(profile: Profile, limiter: FakeLimiter) -> tuple[str, bool]:
    cmd = [sys.executable, "-c", "print('hello')"]
    proc, ok = start_rank(cmd, 2, {"PATH": "/usr/bin:/bin"}, profile, limiter)
    out, _ = proc.communicate(timeout=30)
    return out.decode(), ok


def test_start_rank_limits_only_a_rank_with_a_profile():
    limiter = FakeLimiter(ok=False)
    assert _started(Profile(), limiter) == ("hello\n", True)  # nothing to enforce
    assert limiter.calls == []
    assert _started(Profile(cpu_share=0.4, cpu_period_ms=10), limiter) == ("hello\n", False)
    assert limiter.calls == [("rank2", 0.4, [], 10_000)]


def test_start_rank_pinned_without_a_share_gets_every_core_and_counts_as_enforced():
    import os

    limiter = FakeLimiter(ok=False)
    assert _started(Profile(cpus=(0,)), limiter)[1] is True
    assert limiter.calls == [("rank2", float(os.cpu_count() or 1), [0], 100_000)]


def test_failure_message_adds_the_failed_ranks_last_15_lines():
    tails = {0: ["fine"], 1: [f"line {i}" for i in range(20)]}
    assert failure_message("all ranks finished", None, tails) == "all ranks finished"
    text = failure_message("rank 1 exited with code 7; stopped the other ranks", 1, tails)
    lines = text.splitlines()
    assert lines[:2] == ["rank 1 exited with code 7; stopped the other ranks", "last lines of rank 1:"]
    assert lines[2:] == [f"  line {i}" for i in range(5, 20)]


def test_signals_set_stop_while_inside_and_are_restored_after():
    stop = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with _stop_on_signals(stop):
        signal.raise_signal(signal.SIGTERM)
        assert stop.is_set()
    assert signal.getsignal(signal.SIGTERM) is before


def test_parse_profiles():
    assert parse_profiles(None, 2, None) == [Profile(), Profile()]
    assert parse_profiles("cpu=1:1.0,cpu=0+2:0.4", 2, None) == [
        Profile(device="cpu=1:1.0", cpus=(1,), cpu_share=1.0),
        Profile(device="cpu=0+2:0.4", cpus=(0, 2), cpu_share=0.4),
    ]
    with pytest.raises(SystemExit, match="--profiles has 1 entries for -np 2"):
        parse_profiles("cpu=1:1.0", 2, None)
    with pytest.raises(SystemExit, match="needs --pool"):
        parse_profiles("fast,slow", 2, None)
