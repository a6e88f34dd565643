"""The preload cache (pipelines.preload.cache): hits and misses, concurrent runs, SIGTERM and
stale temporary folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pipelines.preload.cache import STALE_TMP_AGE_S
from pipelines.preload.stage import preload
from preload.datasets import cache_contents, days, do, spec, table, write

pytestmark = pytest.mark.trainer


def test_cache_hits_on_rerun_and_misses_when_a_file_changes(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=100)
    first = do(tmp_path, data)
    again = do(tmp_path, data)
    assert again["cache_hit"] is True and again["train_shards"] == first["train_shards"]
    changed = data / "dt=2026-01-02" / "part-0.parquet"
    write(changed, table(100, first_id=100, seed=99))
    os.utime(changed, ns=(1, 1))  # even with an old modification time the footer differs
    third = do(tmp_path, data)
    assert third["cache_hit"] is False and third["content_hash"] != first["content_hash"]
    assert sorted(cache_contents(tmp_path)) == sorted([first["content_hash"], third["content_hash"]])
    assert do(tmp_path, data, holdout_fraction=0.2)["cache_hit"] is False  # spec fields count too


def test_concurrent_runs_never_share_a_folder(tmp_path):
    import concurrent.futures

    data = days(tmp_path / "data", n_days=2, rows=300)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(preload, spec(data), tmp_path / f"o{i}", seed=0, cache_root=tmp_path / "cache")
            for i in range(2)
        ]
        a, b = (f.result() for f in futures)
    assert a["train_shards"] == b["train_shards"] and [a["cache_hit"], b["cache_hit"]].count(False) >= 1
    assert cache_contents(tmp_path) == [a["content_hash"]]  # one entry, no temporary folder left


SIGTERM_PROBE = textwrap.dedent(
    """
    import os, sys, time
    import pipelines.preload.convert as convert
    from pipelines.preload.stage import preload
    from pipelines.spec import DatasetSpec

    data, cache, ready = sys.argv[1], sys.argv[2], sys.argv[3]
    real_write = convert._ShardWriter.write

    def write(self, batch):  # the first batch is written, then the test's SIGTERM comes
        real_write(self, batch)
        if not os.path.exists(ready):
            open(ready, "w").close()
        time.sleep(30)

    convert._ShardWriter.write = write
    preload(DatasetSpec(uri=data, feature_shape=[4], num_classes=3), cache + "-out", seed=0, cache_root=cache)
    print("finished")
    """
)


def test_sigterm_during_a_preload_removes_its_temporary_folder(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=50)
    cache, ready = tmp_path / "cache", tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_PROBE, str(data), str(cache), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), proc.communicate(timeout=5)
        assert [n for n in cache_contents(tmp_path) if ".tmp-" in n]  # mid-conversion: a shard is written
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err  # the process still ends by SIGTERM
    assert "finished" not in out and "stopped by SIGTERM" in err
    assert cache_contents(tmp_path) == []


def test_preload_restores_the_sigterm_handler(tmp_path):
    data = days(tmp_path / "data", n_days=1, rows=20)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    do(tmp_path, data)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        do(tmp_path, data, seed=7)  # someone else's handler is left alone
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stale_temporary_folders_are_removed_and_fresh_ones_kept(tmp_path):
    cache = tmp_path / "cache"
    old = time.time() - STALE_TMP_AGE_S - 60
    folders = {
        "stale": ".aaa.tmp-11111111",  # a SIGKILLed build: nothing in it changed for long
        "old-refresh": ".bbb.old-22222222",
        "fresh": ".ccc.tmp-33333333",  # a concurrent build that just started
        "live": ".ddd.tmp-44444444",  # an old folder whose build still writes shards
        "entry": "eeeeeeee",  # a published entry, however old, is never touched
    }
    for key, name in folders.items():
        shard = cache / name / "train" / "train-00000.arrow"
        shard.parent.mkdir(parents=True)
        shard.write_bytes(b"x")
        if key != "fresh":
            for p in (shard, shard.parent, shard.parent.parent):
                os.utime(p, (old, old))
    os.utime(cache / folders["live"] / "train" / "train-00000.arrow")  # written just now
    r = do(tmp_path, days(tmp_path / "data", n_days=1, rows=20))
    kept = {folders["fresh"], folders["live"], folders["entry"], r["content_hash"]}
    assert set(cache_contents(tmp_path)) == kept
