"""CPU quotas of local devices, written to a fake cgroup tree (v1 and v2 layouts)."""

from __future__ import annotations

import os

import pytest

from pipelines.launch.cgroups import (
    GROUP_PREFIX,
    PERIOD_US,
    CpuLimiter,
    cpu_quota_cores,
    own_cpu_group,
    period_for,
    quota_us,
)


def fake_v1(root):
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    return root


def fake_v2(root):
    (root / "cgroup.controllers").write_text("cpu memory")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_quota_is_share_of_period_and_none_when_the_share_covers_the_cores():
    assert quota_us(0.4, 10_000) == 4_000
    assert quota_us(0.4, PERIOD_US) == 40_000
    assert quota_us(1.5, 10_000, cpus=[0, 1]) == 15_000
    # A full share of the pinned cores needs no quota: affinity already limits it.
    assert quota_us(1.0, 10_000, cpus=[1]) is None
    assert quota_us(2.0, 10_000, cpus=[0, 1]) is None
    assert quota_us(1.0, 10_000) == 10_000  # unpinned: the quota is what limits it


def test_period_grows_where_the_quota_would_fall_under_one_millisecond():
    assert period_for(0.4, 10_000) == 10_000
    assert period_for(0.05, 10_000) == 20_000
    assert quota_us(0.05, period_for(0.05, 10_000)) == 1_000


def test_v1_slow_device_gets_quota_and_short_period(tmp_path):
    limiter = CpuLimiter("job1", root=fake_v1(tmp_path))
    assert limiter.limit(os.getpid(), "rank1", 0.4) is True
    group = tmp_path / "cpu" / GROUP_PREFIX / "job1" / "rank1"
    assert (group / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
    assert (group / "cpu.cfs_quota_us").read_text() == str(int(0.4 * PERIOD_US))
    assert (group / "cgroup.procs").read_text() == str(os.getpid())
    limiter.set_share("rank1", 0.25, period_us=PERIOD_US)  # the kubelet's period, as a pod has it
    assert (group / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
    assert (group / "cpu.cfs_quota_us").read_text() == "25000"


def test_v1_full_core_device_has_no_quota(tmp_path):
    limiter = CpuLimiter("job2", root=fake_v1(tmp_path))
    assert limiter.limit(os.getpid(), "rank0", 1.0, cpus=None, period_us=10_000) is True
    group = tmp_path / "cpu" / GROUP_PREFIX / "job2" / "rank0"
    assert (group / "cpu.cfs_quota_us").read_text() == "10000"  # unpinned: limited by the quota
    limiter2 = CpuLimiter("job3", root=tmp_path)
    cpus = sorted(os.sched_getaffinity(0))[:1]
    assert limiter2.limit(os.getpid(), "rank0", 1.0, cpus=cpus) is True
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))  # undo the pinning of the test process
    group = tmp_path / "cpu" / GROUP_PREFIX / "job3" / "rank0"
    assert (group / "cpu.cfs_quota_us").read_text() == "-1"


def test_a_rank_reads_its_own_quota_v1(tmp_path):
    """What the trainer reads to turn CPU time into speed: its cgroup's current quota in cores."""
    limiter = CpuLimiter("job5", root=fake_v1(tmp_path))
    limiter.limit(os.getpid(), "rank1", 0.4)
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"12:cpuset:/\n4:cpu:/{GROUP_PREFIX}/job5/rank1\n3:cpuacct:/\n")
    (tmp_path / "cpu" / GROUP_PREFIX / "job5" / "rank1" / "cpu.stat").write_text("nr_periods 0\n")
    group = own_cpu_group(str(proc), root=tmp_path)
    assert group == (1, tmp_path / "cpu" / GROUP_PREFIX / "job5" / "rank1")
    assert cpu_quota_cores(group) == pytest.approx(0.4)
    limiter.set_share("rank1", 0.25)  # changed during the run: the next reading sees it
    assert cpu_quota_cores(group) == pytest.approx(0.25)
    (group[1] / "cpu.cfs_quota_us").write_text("-1")
    assert cpu_quota_cores(group) is None  # unlimited


def test_a_rank_reads_its_own_quota_v2(tmp_path):
    folder = tmp_path / "kubepods" / "pod1" / "ctr"
    folder.mkdir(parents=True)
    (folder / "cpu.stat").write_text("usage_usec 0\n")
    (folder / "cpu.max").write_text("40000 100000\n")  # a pod with limits.cpu: 400m
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    group = own_cpu_group(str(proc), root=tmp_path)
    assert group == (2, folder)
    assert cpu_quota_cores(group) == pytest.approx(0.4)
    (folder / "cpu.max").write_text("max 100000\n")
    assert cpu_quota_cores(group) is None
    assert own_cpu_group(str(tmp_path / "missing"), root=tmp_path) is None


def test_v2_writes_cpu_max(tmp_path):
    limiter = CpuLimiter("job4", root=fake_v2(tmp_path))
    assert limiter.version == 2
    assert limiter.limit(os.getpid(), "rank1", 0.4, period_us=20_000) is True
    group = tmp_path / GROUP_PREFIX / "job4" / "rank1"
    assert (group / "cpu.max").read_text() == "8000 20000"
    limiter.set_share("rank1", 1.0, period_us=20_000)
    assert (group / "cpu.max").read_text() == "20000 20000"


@pytest.mark.parametrize("period", [0.5, 2000])
def test_pool_rejects_a_period_out_of_range(tmp_path, period):
    from pipelines.spec import SpecError, load_pool

    path = tmp_path / "pool.yaml"
    path.write_text(
        "device_types:\n  - name: slow\n    count: 1\n    memory_gb: 4\n"
        f"    local: {{cpus: [0], cpu_share: 0.4, cpu_period_ms: {period}}}\n"
    )
    with pytest.raises(SpecError, match="cpu_period_ms"):
        load_pool(str(path))
