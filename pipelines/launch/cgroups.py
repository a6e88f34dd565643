"""Make a local "device": pin a process to CPU cores and cap it with a CFS CPU quota.

A quota of 0.4 CPU is exactly what a Kubernetes pod with ``limits.cpu: 400m`` gets: the kernel
throttles the group to 40% of each CFS period (the kubelet's period is 100 ms, and the local
default).  A pool may set a shorter period (``local.cpu_period_ms``): a synchronous step then
finds the slow device uniformly slow, instead of at full speed for 40 ms and stopped for 60 ms.
A share that covers all the pinned cores sets no quota at all (the affinity already limits it,
and a quota equal to the cores still throttles on accounting slack).  cgroup v1
(``cpu.cfs_quota_us``) and v2 (``cpu.max``) are supported.  Where cgroups cannot be written (no
root, read-only mount), the process is only pinned with affinity and a warning says that its
speed is not limited.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path(os.environ.get("HETERO_CGROUP_ROOT", "/sys/fs/cgroup"))
PERIOD_US = 100_000  # the kubelet's CFS period (what a pod's CPU limit gets); local default too
# The folder, under the cpu controller's root, that holds every job's groups.  A deployment whose
# worker may only write below a delegated group (a systemd slice, a container's own group), or that
# gives the pipeline's ranks a CPU weight of their own against its other work, names that group
# here (make test runs its background suites below a low-weight group this way).
GROUP_PREFIX = os.environ.get("HETERO_CGROUP_PARENT", "hetero-pipelines").strip("/") or "hetero-pipelines"


class CpuLimiter:
    """Creates one cgroup per rank under a job group, and removes them at :meth:`cleanup`."""

    def __init__(self, job: str, root: Path = CGROUP_ROOT):
        self.job = job
        self.root = root
        self.version, self.base = self._detect(root)
        self.groups: list[Path] = []
        self.warning: str | None = None

    @staticmethod
    def _detect(root: Path) -> tuple[int | None, Path | None]:
        if (root / "cpu" / "cpu.cfs_quota_us").exists():
            return 1, root / "cpu"
        if (root / "cpu.cfs_quota_us").exists():  # v1 cpu controller mounted at the root
            return 1, root
        if (root / "cgroup.controllers").exists():
            return 2, root
        if (root / "unified" / "cgroup.controllers").exists() and "cpu" in (root / "unified" / "cgroup.controllers").read_text():
            return 2, root / "unified"
        return None, None

    @property
    def available(self) -> bool:
        return self.base is not None

    @property
    def job_dir(self) -> Path | None:
        """The job's group, which holds one group per rank (None without a cpu controller)."""
        return None if self.base is None else self.base / GROUP_PREFIX / self.job

    def limit(self, pid: int, name: str, cpu_share: float, cpus: list[int] | None = None,
              period_us: int = PERIOD_US) -> bool:
        """Pin ``pid`` to ``cpus`` and cap it at ``cpu_share`` CPUs.  True if the quota is enforced."""
        if cpus:
            try:
                os.sched_setaffinity(pid, set(cpus))
            except OSError as e:
                log.warning("cannot pin pid %s to cores %s: %s", pid, cpus, e)
        if self.base is None:
            self._warn(f"no writable cpu cgroup controller under {self.root}")
            return False
        group = self.job_dir / name
        try:
            if self.version == 2:
                self._enable_v2_cpu(group)
            group.mkdir(parents=True, exist_ok=True)
            period_us = period_for(cpu_share, period_us)
            self._write_quota(group, quota_us(cpu_share, period_us, cpus), period_us)
            (group / "cgroup.procs").write_text(str(pid))
        except OSError as e:
            self._warn(f"cannot write cgroup {group}: {e}")
            return False
        self.groups.append(group)
        return True

    def set_share(self, name: str, cpu_share: float, period_us: int = PERIOD_US) -> None:
        """Change a running rank's quota (used to show re-balancing)."""
        group = self.job_dir / name
        period_us = period_for(cpu_share, period_us)
        self._write_quota(group, quota_us(cpu_share, period_us), period_us)

    def _write_quota(self, group: Path, quota: int | None, period_us: int) -> None:
        if self.version == 1:
            # The kernel checks a quota against the current period: lift it, set the period, cap.
            (group / "cpu.cfs_quota_us").write_text("-1")
            (group / "cpu.cfs_period_us").write_text(str(period_us))
            if quota is not None:
                (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{'max' if quota is None else quota} {period_us}")

    def _enable_v2_cpu(self, group: Path) -> None:
        # In v2 a controller must be enabled in every ancestor's cgroup.subtree_control.
        parent = self.base
        for part in group.relative_to(self.base).parts:
            control = parent / "cgroup.subtree_control"
            if control.exists() and "cpu" not in control.read_text().split():
                control.write_text("+cpu")
            parent = parent / part
            parent.mkdir(exist_ok=True)

    def _warn(self, why: str) -> None:
        if self.warning is None:
            self.warning = (
                f"CPU quotas are NOT enforced ({why}); ranks are pinned with affinity only, so "
                "'slow' devices run at full speed. Run as root with a writable cgroup cpu controller "
                "for real slow devices."
            )
            log.warning(self.warning)

    def cleanup(self) -> None:
        """Move nothing, just remove the (now empty) groups of this job."""
        for group in reversed(self.groups):
            try:
                group.rmdir()
            except OSError:
                pass
        if self.job_dir is not None:
            try:
                self.job_dir.rmdir()
            except OSError:
                pass
        self.groups.clear()


def quota_us(cpu_share: float, period_us: int, cpus: list[int] | tuple[int, ...] | None = None) -> int | None:
    """CFS quota in microseconds per period for ``cpu_share`` cores, or None for no quota (the share
    covers every pinned core)."""
    if cpus and cpu_share >= len(cpus):
        return None
    return max(1000, int(round(cpu_share * period_us)))  # the kernel's least quota is 1 ms


def period_for(cpu_share: float, period_us: int) -> int:
    """``period_us``, lengthened where the share's quota would fall under the kernel's 1 ms least."""
    return max(period_us, int(-(-1000 // cpu_share)) if cpu_share > 0 else period_us)


def threads_for(cpu_share: float, cpus: list[int] | None) -> int:
    """TensorFlow threads for a rank: the quota rounded up, at most the pinned cores."""
    import math

    n = max(1, math.ceil(cpu_share - 1e-9))
    if cpus:
        n = min(n, len(cpus))
    return n


def own_cpu_group(proc_cgroup: str = "/proc/self/cgroup", root: Path = CGROUP_ROOT) -> tuple[int, Path] | None:
    """``(version, folder)`` of this process's CPU cgroup (a local rank's, or a pod's container's)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            candidates = [(1, root / controllers), (1, root / "cpu"), (1, root / "cpu,cpuacct")]
        elif controllers == "":
            candidates = [(2, root), (2, root / "unified")]
        else:
            continue
        for version, base in candidates:
            folder = base / path.lstrip("/")
            if (folder / "cpu.stat").exists():
                return version, folder
    return None


def cpu_quota_cores(group: tuple[int, Path] | None = None) -> float | None:
    """This process's current CPU quota in cores (0.4 for 40%), or None when unlimited/unknown.
    Read at every measurement, so a quota changed during a run is seen."""
    group = group or own_cpu_group()
    if group is None:
        return None
    version, folder = group
    try:
        if version == 1:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        else:
            q, per = (folder / "cpu.max").read_text().split()[:2]  # "40000 100000" or "max 100000"
            if q == "max":
                return None
            quota, period = int(q), int(per)
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
