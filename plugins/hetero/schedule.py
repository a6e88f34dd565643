"""When the training DAG runs, configured without editing the DAG file (docs/ARCHITECTURE.md,
"Model versions and promotion"):

- ``HETERO_TRAIN_SCHEDULE``: a cron expression or preset (``@daily``).  Each run covers one whole
  interval (``CronDataIntervalTimetable``): the daily run of 2026-01-02 gets
  [2026-01-02, 2026-01-03), which is what ``dataset.use_data_interval`` trains on; Airflow 3's
  default cron timetable would give it zero width.
- ``HETERO_DATASET_ASSET``: the URI of an Asset that producers update when they write new
  partitions (e.g. ``s3://bucket/shapes``); each update starts a run.
- Both: a run on either (``AssetOrTimeSchedule``).  Neither: manual triggers and backfills only.

``HETERO_MODEL_ASSET`` names the Asset the publish task updates with every new version (default
``x-hetero://models/train_pipeline``), so other DAGs can be scheduled on new models.

The profile bank (docs/ARCHITECTURE.md, "Profiling a pool"):

- ``HETERO_PROFILE_BANK_ASSET`` names the Asset the ``profile_pool`` DAG's ``fit`` task updates
  once a sweep has refreshed the bank and its fits (default ``x-hetero://profiles/bank``).
- ``HETERO_TRAIN_ON_PROFILES=1`` schedules the training DAG on that Asset too: each refresh of the
  bank starts a training run.  With ``HETERO_DATASET_ASSET`` as well, an update of either starts a
  run (``dataset | bank``); with ``HETERO_TRAIN_SCHEDULE`` as well, so does the time schedule.
- ``HETERO_PROFILE_SCHEDULE``: the ``profile_pool`` DAG's own schedule (a cron expression or
  preset such as ``@weekly``); unset, it runs only when triggered.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, CronDataIntervalTimetable

ENV_SCHEDULE = "HETERO_TRAIN_SCHEDULE"
ENV_DATASET_ASSET = "HETERO_DATASET_ASSET"
ENV_MODEL_ASSET = "HETERO_MODEL_ASSET"
DEFAULT_MODEL_ASSET = "x-hetero://models/train_pipeline"
ENV_PROFILE_BANK_ASSET = "HETERO_PROFILE_BANK_ASSET"
DEFAULT_PROFILE_BANK_ASSET = "x-hetero://profiles/bank"
ENV_TRAIN_ON_PROFILES = "HETERO_TRAIN_ON_PROFILES"
ENV_PROFILE_SCHEDULE = "HETERO_PROFILE_SCHEDULE"


def model_asset() -> Asset:
    """The Asset of the published model versions."""
    return Asset(os.environ.get(ENV_MODEL_ASSET) or DEFAULT_MODEL_ASSET)


def dataset_asset() -> Asset | None:
    uri = os.environ.get(ENV_DATASET_ASSET, "").strip()
    return Asset(uri) if uri else None


def profile_bank_asset() -> Asset:
    """The Asset of the profile bank, updated when the ``profile_pool`` DAG has refreshed it."""
    return Asset(os.environ.get(ENV_PROFILE_BANK_ASSET) or DEFAULT_PROFILE_BANK_ASSET)


def train_on_profiles() -> bool:
    """Whether the training DAG is scheduled on the profile bank's Asset (``HETERO_TRAIN_ON_PROFILES``)."""
    value = os.environ.get(ENV_TRAIN_ON_PROFILES, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ENV_TRAIN_ON_PROFILES}={value!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def schedule_from_env() -> Any:
    """The training DAG's ``schedule`` from the environment (see the module docstring)."""
    cron = os.environ.get(ENV_SCHEDULE, "").strip()
    timetable = CronDataIntervalTimetable(cron, timezone="UTC") if cron else None
    assets = [a for a in (dataset_asset(), profile_bank_asset() if train_on_profiles() else None) if a]
    # Any one of the Assets starts a run (a list would wait for all of them).
    condition = (assets[0] | assets[1]) if len(assets) == 2 else assets
    if timetable and assets:
        return AssetOrTimeSchedule(timetable=timetable, assets=condition)
    return timetable or (condition or None)


def profile_schedule_from_env() -> str | None:
    """The ``profile_pool`` DAG's schedule: ``HETERO_PROFILE_SCHEDULE``, else none (manual triggers)."""
    return os.environ.get(ENV_PROFILE_SCHEDULE, "").strip() or None
