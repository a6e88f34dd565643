"""Read scalars and histograms from TensorBoard event files with TensorBoard's own loader.

Each folder at or under the path that holds event files is one TensorBoard run, found as
``tensorboard --logdir`` finds them (``io_wrapper.GetLogdirSubdirectories``), and is read by
TensorBoard's ``plugin_event_accumulator.EventAccumulator`` keeping every point. Its compatibility
layer turns TF1 values (``simple_value``, ``HistogramProto``) into the tensors TF2's
``tf.summary.scalar`` and ``tf.summary.histogram`` write, so one path reads both. Files are read
through TensorFlow's file system when it is installed (TensorBoard's own otherwise), so any
location ``tf.summary`` can write to can be read back.

A record cut short or failing its checksum ends the reading of its file, as in TensorBoard: the
records before it are kept, the rest of that file is skipped.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

from tensorboard.backend.event_processing import io_wrapper
from tensorboard.backend.event_processing import plugin_event_accumulator as accumulator
from tensorboard.compat import tf
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

from pipelines.core.imports import load_tensorflow
from pipelines.errors import StageError

__all__ = ["Events", "EventsNotFoundError", "Histogram", "Scalar", "read_events", "read_histograms", "read_scalars"]

log = logging.getLogger(__name__)

Scalar = tuple[int, float, float]  # (step, wall_time, value)
Bucket = tuple[float, float, float]  # (left edge, right edge, count)
Histogram = tuple[int, float, list[Bucket]]  # (step, wall_time, buckets)
KEEP_ALL = {accumulator.TENSORS: 0}  # TensorBoard's size guidance: 0 keeps every point


class Events(NamedTuple):
    """What :func:`read_events` found: ``tag -> points`` for scalars and for histograms."""

    scalars: dict[str, list[Scalar]]
    histograms: dict[str, list[Histogram]]


class EventsNotFoundError(StageError):
    """The event file or folder does not exist."""


def read_events(path_or_dir: str | os.PathLike) -> Events:
    """Every scalar and histogram in the event file, or the event files at or under the folder.

    Returns :class:`Events`: ``scalars`` (``tag -> [(step, wall_time, value)]``, tags sorted) and
    ``histograms`` (``tag -> [(step, wall_time, [(left, right, count), ...])]``, tags in the order
    they were first written, folder by folder in sorted order: the model's order for the
    trainer's weights). Points are sorted by step; when several carry the same tag and step (a
    run resumed from a checkpoint repeats steps), the one written last (latest wall time) is
    kept. Raises :class:`EventsNotFoundError` when the path does not exist.
    """
    path = os.fspath(path_or_dir)
    try:  # TensorBoard's `tf` imports it on first use: through pipelines.core.imports instead
        load_tensorflow()
    except ImportError:  # not installed: TensorBoard reads with its own file system
        pass
    if not tf.io.gfile.exists(path):
        raise EventsNotFoundError(f"{path}: no such event file or folder")
    runs = [path] if io_wrapper.IsSummaryEventsFile(path) else sorted(io_wrapper.GetLogdirSubdirectories(path))
    scalars: dict[str, dict[int, Scalar]] = {}
    histograms: dict[str, dict[int, Histogram]] = {}
    for run in runs:
        found = accumulator.EventAccumulator(run, size_guidance=KEEP_ALL, purge_orphaned_data=False).Reload()
        for tag, plugin in _tags(found):
            by_step = (scalars if plugin == scalar_metadata.PLUGIN_NAME else histograms).setdefault(tag, {})
            for event in found.Tensors(tag):
                value = tensor_util.make_ndarray(event.tensor_proto)
                data = float(value.item()) if plugin == scalar_metadata.PLUGIN_NAME else _buckets(value, tag, run)
                old = by_step.get(event.step)
                if data is not None and (old is None or event.wall_time >= old[1]):
                    by_step[event.step] = (event.step, event.wall_time, data)
    return Events(
        {tag: [by_step[s] for s in sorted(by_step)] for tag, by_step in sorted(scalars.items())},
        {tag: [by_step[s] for s in sorted(by_step)] for tag, by_step in histograms.items() if by_step},
    )


def _tags(found: accumulator.EventAccumulator) -> list[tuple[str, str]]:
    """``(tag, plugin name)`` of the run's scalars and histograms, in the order first written."""
    plugins = {tag: meta.plugin_data.plugin_name for tag, meta in found.AllSummaryMetadata().items()}
    wanted = (scalar_metadata.PLUGIN_NAME, histogram_metadata.PLUGIN_NAME)
    return [(tag, plugins[tag]) for tag in found.Tags()[accumulator.TENSORS] if plugins.get(tag) in wanted]


def _buckets(value: Any, tag: str, run: str) -> list[Bucket] | None:
    """The ``(left, right, count)`` rows of a histogram tensor; None, with a warning, for a tensor
    that is not ``[k, 3]``."""
    if value.ndim != 2 or value.shape[1] != 3:
        log.warning("%s: histogram %r has shape %s, not [k, 3]; skipped", run, tag, list(value.shape))
        return None
    return [(float(left), float(right), float(count)) for left, right, count in value.tolist()]


def read_scalars(path_or_dir: str | os.PathLike) -> dict[str, list[Scalar]]:
    """Every scalar at or under ``path_or_dir``: ``tag -> [(step, wall_time, value)]`` sorted by
    step (see :func:`read_events`)."""
    return read_events(path_or_dir).scalars


def read_histograms(path_or_dir: str | os.PathLike) -> dict[str, list[Histogram]]:
    """Every histogram at or under ``path_or_dir``: ``tag -> [(step, wall_time, buckets)]``
    sorted by step, each bucket ``(left edge, right edge, count)`` (see :func:`read_events`)."""
    return read_events(path_or_dir).histograms
