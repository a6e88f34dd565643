"""Read scalar and histogram summaries from TensorBoard event files without TensorFlow.

An event file is a sequence of TFRecords, each holding one serialized ``Event`` protocol buffer:

    uint64 length (little-endian) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)

Only the few protobuf fields that carry scalars and histograms are decoded
(``Event.wall_time/step/summary``, ``Summary.value``, ``Value.tag/simple_value/histo/tensor/metadata``,
the plugin name of ``SummaryMetadata`` and the numeric parts of ``TensorProto``), with a small
wire-format reader, so this module needs nothing beyond the standard library for local files and
``pyarrow`` for remote ones (``s3://``, ``gs://``, ``hdfs://``, ``file://``).

A histogram is what TF2's ``tf.summary.histogram`` writes: a ``[k, 3]`` tensor of
``(left edge, right edge, count)`` rows under the plugin name ``histograms``; a TF1
``HistogramProto`` (``Value.histo``) is turned into the same rows, as TensorBoard does.

A truncated last record, as left by a writer that was killed mid-write, is ignored; a complete
record that fails its checksum or does not parse raises :class:`EventFileError` naming the file
and the byte offset.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pipelines.errors import StageError

__all__ = [
    "EventFileError",
    "EventsNotFoundError",
    "Events",
    "Histogram",
    "Scalar",
    "crc32c",
    "masked_crc32c",
    "iter_records",
    "parse_event",
    "events_from_bytes",
    "scalars_from_bytes",
    "list_event_files",
    "read_events",
    "read_scalars",
    "read_histograms",
]

log = logging.getLogger(__name__)

EVENT_FILE_MARKER = "tfevents"
HISTOGRAM_PLUGIN = "histograms"  # the plugin name tf.summary.histogram writes
Scalar = tuple[int, float, float]  # (step, wall_time, value)
Bucket = tuple[float, float, float]  # (left edge, right edge, count)
Histogram = tuple[int, float, list[Bucket]]  # (step, wall_time, buckets)


class Events(NamedTuple):
    """What :func:`read_events` found: ``tag -> points`` for scalars and for histograms."""

    scalars: dict[str, list[Scalar]]
    histograms: dict[str, list[Histogram]]


class EventFileError(StageError):
    """An event file that is corrupt in the middle (not merely truncated at the end)."""


class EventsNotFoundError(StageError):
    """The event file or folder does not exist."""


# ----------------------------------------------------------------------------------- crc32c


def _make_table() -> tuple[int, ...]:
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _make_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, the checksum TFRecord uses."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC stored in TFRecord framing: rotate right by 15 and add a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -------------------------------------------------------------------------------- TFRecords


def iter_records(data: bytes, source: str = "<bytes>", verify: bool = True) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, payload)`` for each complete TFRecord in ``data``.

    A record cut short by the end of ``data`` is ignored (with a log line).  A complete record
    whose length or payload checksum is wrong raises :class:`EventFileError` naming ``source`` and
    the record's offset; ``verify=False`` skips the checksums.
    """
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < 12:
            log.warning("%s: ignoring truncated record header at offset %d", source, pos)
            return
        header = data[pos : pos + 8]
        (length,) = struct.unpack_from("<Q", data, pos)
        (length_crc,) = struct.unpack_from("<I", data, pos + 8)
        if verify and masked_crc32c(header) != length_crc:
            raise EventFileError(f"{source}: corrupt record at offset {pos}: length checksum mismatch")
        start = pos + 12
        stop = start + length
        if stop + 4 > end:
            log.warning(
                "%s: ignoring truncated record at offset %d (%d bytes missing)", source, pos, stop + 4 - end
            )
            return
        payload = data[start:stop]
        if verify:
            (data_crc,) = struct.unpack_from("<I", data, stop)
            if masked_crc32c(payload) != data_crc:
                raise EventFileError(f"{source}: corrupt record at offset {pos}: data checksum mismatch")
        yield pos, payload
        pos = stop + 4


# ------------------------------------------------------------------------- protobuf decoding

# TensorFlow DataType enum values we can turn into a float, with their little-endian layout.
_DTYPES = {1: "<f", 2: "<d", 3: "<i", 9: "<q", 19: "<e"}  # FLOAT, DOUBLE, INT32, INT64, HALF


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("varint runs past the end of the message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(field_number, wire_type, value)``; value is an int for varints, bytes otherwise."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire} for field {field}")
        if pos > end:
            raise ValueError(f"field {field} runs past the end of the message")
        yield field, wire, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _repeated(wire: int, value: Any, fmt: str) -> list[float]:
    """Values of a repeated numeric field, packed (wire type 2) or not."""
    if wire == 2:
        if fmt in ("<f", "<d"):
            size = struct.calcsize(fmt)
            return list(struct.unpack(f"<{len(value) // size}{fmt[1]}", value))
        out, pos = [], 0
        while pos < len(value):
            v, pos = _varint(value, pos)
            out.append(_int64(v))
        return out
    if wire == 0:
        return [_int64(value)]
    return list(struct.unpack(fmt, value))


def _tensor(buf: bytes) -> tuple[int, list[int] | None, bytes, list[float]]:
    """A TensorProto's ``(dtype, shape, tensor_content, repeated values)``; the shape is None
    when the proto does not give one."""
    dtype, shape, content = 0, None, b""
    values: list[float] = []
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 0:
            dtype = value
        elif field == 2 and wire == 2:
            shape = _shape(value)
        elif field == 4 and wire == 2:
            content = value
        elif field == 5:
            values += _repeated(wire, value, "<f")
        elif field == 6:
            values += _repeated(wire, value, "<d")
        elif field in (7, 10):  # int_val, int64_val (varints)
            values += _repeated(wire, value, "<q")
        elif field == 13:  # half_val: halves stored in the low bits of int32 varints
            values += [
                struct.unpack("<e", struct.pack("<H", v & 0xFFFF))[0] for v in _repeated(wire, value, "<q")
            ]
    return dtype, shape, content, values


def _shape(buf: bytes) -> list[int] | None:
    """The dimensions of a TensorShapeProto (None for an unknown rank)."""
    dims = []
    for field, wire, value in _fields(buf):
        if field == 2 and wire == 2:
            dims.append(next((_int64(v) for f, w, v in _fields(value) if f == 1 and w == 0), 0))
        elif field == 3 and wire == 0 and value:
            return None
    return dims


def _tensor_scalar(buf: bytes) -> float | None:
    """The value of a one-element numeric TensorProto, or None for anything else."""
    dtype, _, content, values = _tensor(buf)
    fmt = _DTYPES.get(dtype)
    if fmt is None:
        return None
    if content:
        if len(content) != struct.calcsize(fmt):
            return None  # not a scalar
        return float(struct.unpack(fmt, content)[0])
    if len(values) == 1:
        return float(values[0])
    return None


def _tensor_histogram(buf: bytes) -> list[Bucket]:
    """The ``(left, right, count)`` rows of a ``[k, 3]`` numeric TensorProto.

    Repeated values shorter than the tensor are padded with the last one (zeros when there are
    none), as TensorFlow reads them.  Raises ``ValueError`` for any other shape or type.
    """
    dtype, shape, content, values = _tensor(buf)
    fmt = _DTYPES.get(dtype)
    if fmt is None:
        raise ValueError(f"histogram tensor has non-numeric dtype {dtype}")
    if shape is None or len(shape) != 2 or shape[0] < 0 or shape[1] != 3:
        raise ValueError(f"histogram tensor has shape {shape}, not [k, 3]")
    size = shape[0] * 3
    if content:
        width = struct.calcsize(fmt)
        if len(content) != size * width:
            raise ValueError(f"histogram tensor of shape {shape} holds {len(content)} bytes, not {size * width}")
        values = list(struct.unpack(f"<{size}{fmt[1]}", content))
    elif len(values) > size:
        raise ValueError(f"histogram tensor of shape {shape} holds {len(values)} values")
    else:
        values = values + [values[-1] if values else 0.0] * (size - len(values))
    return [(float(values[i]), float(values[i + 1]), float(values[i + 2])) for i in range(0, size, 3)]


def _legacy_histogram(buf: bytes) -> list[Bucket]:
    """A TF1 ``HistogramProto`` as ``(left, right, count)`` rows: bucket i spans from the limit
    before it (the minimum for the first) to its limit (the maximum for the last), as
    TensorBoard converts it."""
    low = high = 0.0
    limits: list[float] = []
    counts: list[float] = []
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 1:
            (low,) = struct.unpack("<d", value)
        elif field == 2 and wire == 1:
            (high,) = struct.unpack("<d", value)
        elif field == 6:
            limits += _repeated(wire, value, "<d")
        elif field == 7:
            counts += _repeated(wire, value, "<d")
    if len(limits) != len(counts):
        raise ValueError(f"histogram has {len(limits)} bucket limits but {len(counts)} counts")
    if not counts:
        return []
    lefts, rights = [low, *limits[:-1]], [*limits[:-1], high]
    return [(float(a), float(b), float(c)) for a, b, c in zip(lefts, rights, counts, strict=True)]


def parse_event(buf: bytes) -> tuple[int, float, list[tuple[str, float]]]:
    """Decode one serialized ``Event`` into ``(step, wall_time, [(tag, value), ...])``.

    Only scalar values are returned: ``simple_value`` (TF1 style) or a one-element numeric
    ``tensor`` (TF2 ``tf.summary.scalar``).  Raises ``ValueError`` on malformed input.
    """
    step, wall_time, values = _parse_event(buf, {})
    return step, wall_time, [(tag, data) for tag, kind, data in values if kind == "scalar"]


def _parse_event(buf: bytes, plugins: dict[str, str]) -> tuple[int, float, list[tuple[str, str, Any]]]:
    """``(step, wall_time, [(tag, kind, data), ...])`` with kind ``scalar`` (data a float) or
    ``histogram`` (data a list of buckets).  ``plugins`` maps tags to the plugin name their
    metadata gave, which TensorBoard allows only on a tag's first value in a file."""
    step, wall_time = 0, 0.0
    values: list[tuple[str, str, Any]] = []
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 1:
            (wall_time,) = struct.unpack("<d", value)
        elif field == 2 and wire == 0:
            step = _int64(value)
        elif field == 5 and wire == 2:
            for sfield, swire, svalue in _fields(value):
                if sfield == 1 and swire == 2:
                    decoded = _summary_value(svalue, plugins)
                    if decoded is not None:
                        values.append(decoded)
    return step, wall_time, values


def _plugin_name(buf: bytes) -> str:
    """``SummaryMetadata.plugin_data.plugin_name`` ("" when there is none)."""
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 2:
            for pfield, pwire, pvalue in _fields(value):
                if pfield == 1 and pwire == 2:
                    return pvalue.decode("utf-8", errors="replace")
    return ""


def _summary_value(buf: bytes, plugins: dict[str, str]) -> tuple[str, str, Any] | None:
    tag: str | None = None
    number: float | None = None
    tensor = histo = None
    plugin = ""
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 2:
            tag = value.decode("utf-8", errors="replace")
        elif field == 2 and wire == 5:
            (number,) = struct.unpack("<f", value)
        elif field == 5 and wire == 2:
            histo = value
        elif field == 8 and wire == 2:
            tensor = value
        elif field == 9 and wire == 2:
            plugin = _plugin_name(value)
    if tag is None:
        return None
    if plugin:
        plugins[tag] = plugin
    try:
        if histo is not None:
            return tag, "histogram", _legacy_histogram(histo)
        if tensor is not None and plugins.get(tag) == HISTOGRAM_PLUGIN:
            return tag, "histogram", _tensor_histogram(tensor)
    except (ValueError, struct.error) as e:
        raise ValueError(f"histogram {tag!r}: {e}") from None
    if tensor is not None:
        number = _tensor_scalar(tensor)
    return None if number is None else (tag, "scalar", float(number))


def events_from_bytes(data: bytes, source: str = "<bytes>", verify: bool = True) -> Events:
    """All scalars and histograms in one event file's bytes, in file order."""
    out = Events({}, {})
    plugins: dict[str, str] = {}
    for offset, payload in iter_records(data, source, verify):
        try:
            step, wall_time, values = _parse_event(payload, plugins)
        except (ValueError, struct.error) as e:
            raise EventFileError(f"{source}: corrupt record at offset {offset}: {e}") from None
        for tag, kind, value in values:
            found = out.scalars if kind == "scalar" else out.histograms
            found.setdefault(tag, []).append((step, wall_time, value))
    return out


def scalars_from_bytes(data: bytes, source: str = "<bytes>", verify: bool = True) -> dict[str, list[Scalar]]:
    """All scalars in one event file's bytes, in file order: ``tag -> [(step, wall_time, value)]``."""
    return events_from_bytes(data, source, verify).scalars


# ------------------------------------------------------------------------------- file access


def _is_uri(path: str) -> bool:
    return "://" in path


def list_event_files(path_or_dir: str | os.PathLike, fs: Any = None) -> list[str]:
    """Event files (``events.out.tfevents.*``) at or under ``path_or_dir``, sorted by path.

    ``fs`` is a ``pyarrow.fs.FileSystem`` (``path_or_dir`` is then a path inside it); without one,
    a URI is resolved with ``pyarrow.fs.FileSystem.from_uri`` and anything else is a local path.
    Raises :class:`EventsNotFoundError` if the path does not exist.
    """
    fs, path = _resolve(path_or_dir, fs)
    if fs is None:
        local = Path(path)
        if local.is_file():
            return [str(local)]
        if not local.is_dir():
            raise EventsNotFoundError(f"{local}: no such event file or folder")
        return sorted(str(p) for p in local.rglob("*") if p.is_file() and _is_event_name(p.name))
    import pyarrow.fs as pafs

    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [path]
    if info.type != pafs.FileType.Directory:
        raise EventsNotFoundError(f"{path_or_dir}: no such event file or folder")
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and _is_event_name(i.base_name))


def _is_event_name(name: str) -> bool:
    return name.startswith("events.out.") and EVENT_FILE_MARKER in name


def _resolve(path_or_dir: str | os.PathLike, fs: Any) -> tuple[Any, str]:
    path = os.fspath(path_or_dir)
    if fs is None and _is_uri(path):
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(path)
    return fs, path


def _read_bytes(path: str, fs: Any) -> bytes:
    if fs is None:
        return Path(path).read_bytes()
    with fs.open_input_stream(path) as f:
        return f.read()


def read_events(path_or_dir: str | os.PathLike, fs: Any = None, *, verify: bool = True) -> Events:
    """Read every scalar and histogram from the event file(s) at or under ``path_or_dir``.

    Returns :class:`Events`: ``scalars`` (``tag -> [(step, wall_time, value)]``, tags sorted)
    and ``histograms`` (``tag -> [(step, wall_time, [(left, right, count), ...])]``, tags in the
    order they were first written: the model's order for the trainer's weights).  Points are
    sorted by step; when several records carry the same tag and step (a run resumed from a
    checkpoint repeats steps), the one written last (latest wall time) is kept.  Local paths
    need only the standard library; URIs (``s3://``, ``gs://``, ``hdfs://``, ``file://``) or an
    explicit ``fs`` (a ``pyarrow.fs.FileSystem``) use pyarrow.  ``verify=False`` skips the CRC
    checks (faster on large files).
    """
    fs, path = _resolve(path_or_dir, fs)
    scalars: dict[str, dict[int, Scalar]] = {}
    histograms: dict[str, dict[int, Histogram]] = {}
    for file in list_event_files(path, fs):
        found = events_from_bytes(_read_bytes(file, fs), file, verify)
        _keep_latest(scalars, found.scalars)
        _keep_latest(histograms, found.histograms)
    return Events(
        {tag: [by_step[s] for s in sorted(by_step)] for tag, by_step in sorted(scalars.items())},
        {tag: [by_step[s] for s in sorted(by_step)] for tag, by_step in histograms.items()},
    )


def _keep_latest(latest: dict[str, dict[int, Any]], found: dict[str, list[Any]]) -> None:
    """Merge ``tag -> [(step, wall_time, ...)]`` into ``latest``, one point per tag and step: the
    one with the latest wall time."""
    for tag, points in found.items():
        by_step = latest.setdefault(tag, {})
        for point in points:
            old = by_step.get(point[0])
            if old is None or point[1] >= old[1]:
                by_step[point[0]] = point


def read_scalars(
    path_or_dir: str | os.PathLike, fs: Any = None, *, verify: bool = True
) -> dict[str, list[Scalar]]:
    """Every scalar at or under ``path_or_dir``: ``tag -> [(step, wall_time, value)]`` sorted by
    step (see :func:`read_events`)."""
    return read_events(path_or_dir, fs, verify=verify).scalars


def read_histograms(
    path_or_dir: str | os.PathLike, fs: Any = None, *, verify: bool = True
) -> dict[str, list[Histogram]]:
    """Every histogram at or under ``path_or_dir``: ``tag -> [(step, wall_time, buckets)]``
    sorted by step, each bucket ``(left edge, right edge, count)`` (see :func:`read_events`)."""
    return read_events(path_or_dir, fs, verify=verify).histograms
