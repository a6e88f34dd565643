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
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, CronDataIntervalTimetable

ENV_SCHEDULE = "HETERO_TRAIN_SCHEDULE"
ENV_DATASET_ASSET = "HETERO_DATASET_ASSET"
ENV_MODEL_ASSET = "HETERO_MODEL_ASSET"
DEFAULT_MODEL_ASSET = "x-hetero://models/train_pipeline"


def model_asset() -> Asset:
    """The Asset of the published model versions."""
    return Asset(os.environ.get(ENV_MODEL_ASSET) or DEFAULT_MODEL_ASSET)


def dataset_asset() -> Asset | None:
    uri = os.environ.get(ENV_DATASET_ASSET, "").strip()
    return Asset(uri) if uri else None


def schedule_from_env() -> Any:
    """The DAG's ``schedule`` from the environment (see the module docstring)."""
    cron = os.environ.get(ENV_SCHEDULE, "").strip()
    timetable = CronDataIntervalTimetable(cron, timezone="UTC") if cron else None
    data = dataset_asset()
    if timetable and data:
        return AssetOrTimeSchedule(timetable=timetable, assets=[data])
    return timetable or ([data] if data else None)
