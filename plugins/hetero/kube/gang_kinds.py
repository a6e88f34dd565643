"""The kinds of gang: one manager (:class:`hetero.kube.gang_manager.GangManager`), configured by
what its result is and who decides its outcome (docs/ARCHITECTURE.md, "Launchers" and "Failure
rules").

- :data:`HOROVOD`: every rank must succeed, the first to fail fails the job; rank 0's last JSON
  line is the result.
- :data:`PARAMETER_SERVER`: the chief (rank 0) decides.  Its success ends the job (the others
  serve until deleted) and its last JSON line is the result, with the workers the job went on
  without; a failed or vanished worker is logged and tolerated until none is left; a failed or
  vanished parameter server fails the job.
- :data:`CALIBRATION`: the estimate stage's calibration pods, one per device type, under the
  Horovod rules; each writes its profile into the run directory, so the result is the gang's
  summary (what ran) instead of a result line.
- :data:`PROFILE`: one profiling pod (a sweep or the bank's fit) under the Horovod rules; its last
  JSON line is the result.
"""

from __future__ import annotations

import dataclasses

__all__ = ["CALIBRATION", "GangKind", "HOROVOD", "KINDS", "PARAMETER_SERVER", "PROFILE", "kind_named"]


@dataclasses.dataclass(frozen=True)
class GangKind:
    """What a gang is: how it is named in events and logs, who decides its outcome and what its
    result is read from."""

    name: str  # the trigger's event and serialized kwargs carry it (kind_named)
    lead: str = "rank 0"  # pod rank 0: its log is streamed into the task log
    noun: str = "ranks"  # the pods, in "All 3 ranks are running"
    done: str = "every rank succeeded"  # what the gang waits for, in messages
    lead_decides: bool = False  # the lead's success ends the job: lost workers are tolerated, servers are not
    result_line: bool = True  # the result is the lead's last JSON line; else the gang's summary (what ran)


HOROVOD = GangKind("horovod")
PARAMETER_SERVER = GangKind("parameter_server", lead="chief", noun="tasks", done="the chief succeeded",
                            lead_decides=True)
CALIBRATION = GangKind("calibration", result_line=False)
PROFILE = GangKind("profile")
KINDS = {kind.name: kind for kind in (HOROVOD, PARAMETER_SERVER, CALIBRATION, PROFILE)}


def kind_named(name: str) -> GangKind:
    """The kind called ``name`` (how a trigger, rebuilt from its kwargs, knows its gang)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown gang kind {name!r}") from None
