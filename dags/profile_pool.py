"""Profile a pool: sweep a family of generated models on every device type, probe the pool's
allreduce, train reference models, fit the profile bank and update its Asset (docs/ARCHITECTURE.md,
"Profiling a pool")."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, TriggerRule

from hetero.notify import run_failure_notice, task_failure_notice
from hetero.profiling import (
    AllreduceProbeOperator,
    BankFitOperator,
    PoolDeviceTypesOperator,
    ProfileSweepOperator,
    ReferenceRunsOperator,
    profile_params,
)
from hetero.schedule import profile_bank_asset, profile_schedule_from_env

DOC = """
### Profiling a pool

Measures how fast each device type of a pool trains a family of generated models (CNNs of
varying depth, filters, dense layers and input size; MLPs), each at several batch sizes, and
stores the timings in the profile bank, from which the estimate stage predicts step time and
memory for any model:

1. **device_types**: read the pool file and list its device types;
2. **sweep**: one mapped task per device type, running the sweep on one device of that type
   (locally a process pinned and capped as the type, one at a time; on Kubernetes a pod with the
   type's resources and placement, all in parallel);
3. **probe_allreduce**: time a short allreduce between ranks placed as the pool's device types
   (locally processes pinned and capped as the types; on Kubernetes a Horovod gang of rank pods
   built as a training's, a device of each type in turn), stored in the bank for the pool and
   launcher; skipped for a one-device pool;
4. **reference_runs**: two short real trainings of reference models through the pipeline's stages
   (on Kubernetes the training's stage pods, calibration pods and Horovod train gang, on data a pod
   writes to the artifact volume), recorded in the bank, so the first run of any model on the pool
   is predicted with its synchronous costs (`reference_runs` param);
5. **fit**: fit each device type's step-time and memory regressions over the bank, with
   cross-validation, and update the bank's Asset (`x-hetero://profiles/bank`), on which the
   training DAG can be scheduled (`HETERO_TRAIN_ON_PROFILES=1`).

`size` sets how many models and batches are timed: `tiny` is a smoke test, `small` (the default)
takes a few minutes per device type on two cores. The bank is `profile_bank`, or
`<artifact_root>/_profiles`.
"""

with DAG(
    dag_id="profile_pool",
    schedule=profile_schedule_from_env(),  # HETERO_PROFILE_SCHEDULE; unset: manual triggers only
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,  # one refresh of the bank at a time
    doc_md=DOC,
    params=profile_params(),
    on_failure_callback=run_failure_notice(),  # [hetero] notify_on_failure (hetero.notify); None when unset
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30), "retry_exponential_backoff": True,
                  "on_failure_callback": task_failure_notice()},
    tags=["profiling"],
):
    device_types = PoolDeviceTypesOperator(task_id="device_types")
    # One task per device type; local sweeps take a machine-wide lock (hetero.profiling.sweep_lock),
    # Kubernetes sweeps run in parallel, each in a pod of its type.
    sweep = ProfileSweepOperator.partial(task_id="sweep", map_index_template="{{ task.device }}").expand(
        device=device_types.output
    )
    probe = AllreduceProbeOperator(task_id="probe_allreduce")  # Kubernetes: a gang of rank pods
    reference = ReferenceRunsOperator(task_id="reference_runs", trigger_rule=TriggerRule.NONE_FAILED)
    fit = BankFitOperator(task_id="fit", outlets=[profile_bank_asset()], trigger_rule=TriggerRule.NONE_FAILED)
    sweep >> probe >> reference >> fit
