"""Reading event files back (pipelines.analyze.events, TensorBoard's loader) from files that
TensorFlow's summary API wrote."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np
import pytest

from analyze.synthetic import write_tf_events, write_tf_histograms
from pipelines.analyze import events

pytestmark = pytest.mark.trainer

tf = pytest.importorskip("tensorflow")


def record_offsets(data: bytes) -> list[tuple[int, int]]:
    """``(offset, payload length)`` of each TFRecord: uint64 length, uint32 crc, payload, uint32 crc."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, length))
        pos += 12 + length + 4
    return out


def steps_of(path: Path) -> list[int]:
    """The step of each record, as TensorFlow's own iterator reads the file."""
    return [e.step for e in tf.compat.v1.train.summary_iterator(str(path))]


def test_reads_scalars_of_several_steps_across_files_and_run_folders(tmp_path):
    logdir = tmp_path / "events"
    write_tf_events(logdir, {"train/loss": [(s, 1.0 / (s + 1)) for s in range(5)], "rank0/batch": [(0, 24.0)]})
    write_tf_events(logdir, {"train/loss": [(s, 0.1) for s in range(5, 8)]})
    write_tf_events(logdir / "sub", {"train/learning_rate": [(3, 0.125), (7, 0.0625)]}, dtype=tf.float64)

    scalars = events.read_scalars(logdir)

    assert list(scalars) == ["rank0/batch", "train/learning_rate", "train/loss"]  # sorted; text left out
    loss = scalars["train/loss"]
    assert [p[0] for p in loss] == list(range(8))
    np.testing.assert_allclose([p[2] for p in loss], [1.0, 0.5, 1 / 3, 0.25, 0.2, 0.1, 0.1, 0.1], rtol=1e-6)
    assert all(p[1] > 1e9 for p in loss) and [p[1] for p in loss] == sorted(p[1] for p in loss)
    assert [(s, v) for s, _, v in scalars["rank0/batch"]] == [(0, 24.0)]
    assert [(s, v) for s, _, v in scalars["train/learning_rate"]] == [(3, 0.125), (7, 0.0625)]  # float64 exact
    assert all(isinstance(v, float) for _, _, v in loss)


def test_a_resumed_run_repeats_steps_and_the_later_value_wins(tmp_path):
    write_tf_events(tmp_path, {"train/loss": [(0, 5.0), (1, 4.0), (2, 3.5)]})
    write_tf_events(tmp_path, {"train/loss": [(1, 3.0), (2, 2.0), (3, 1.0)]})  # resumed from step 1
    assert [(s, v) for s, _, v in events.read_scalars(tmp_path)["train/loss"]] == [(0, 5.0), (1, 3.0), (2, 2.0), (3, 1.0)]


def tf_decoded(path: Path) -> dict[str, list[tuple[int, list]]]:
    """What TensorFlow's own parser finds in an event file: ``tag -> [(step, [k, 3] rows)]``."""
    out: dict[str, list] = {}
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name == "histograms":
                out.setdefault(v.tag, []).append((event.step, tf.make_ndarray(v.tensor).tolist()))
    return out


def test_reads_tf2_histograms_as_tensorflow_wrote_them(tmp_path):
    rng = np.random.default_rng(0)
    kernel = [(s, rng.normal(s, 1.0, (6, 5)).astype(np.float32)) for s in (0, 10, 20)]
    path = write_tf_histograms(tmp_path, {"weights/d/kernel": kernel, "weights/d/bias": [(0, np.zeros(4, np.float32))]})
    write_tf_events(tmp_path, {"train/loss": [(0, 1.0)]})  # scalars (and other/histogram) beside them

    got = events.read_events(tmp_path)

    assert list(got.histograms) == ["weights/d/kernel", "weights/d/bias", "other/histogram"]  # first-written order
    assert list(got.scalars) == ["train/loss"]
    expected = tf_decoded(path)
    for tag in ("weights/d/kernel", "weights/d/bias"):
        assert [(s, [list(b) for b in buckets]) for s, _, buckets in got.histograms[tag]] == expected[tag]
    for (step, values), (s, wall, buckets) in zip(kernel, got.histograms["weights/d/kernel"], strict=True):
        assert s == step and wall > 1e9 and len(buckets) == 30  # TF 2.15's default bucket count
        assert sum(c for _, _, c in buckets) == 30
        assert (buckets[0][0], buckets[-1][1]) == pytest.approx((values.min(), values.max()))
    assert sum(c for _, _, c in got.histograms["other/histogram"][0][2]) == 3


def test_histogram_tags_keep_folder_order_then_first_written_order(tmp_path):
    write_tf_histograms(tmp_path / "b", {"z": [(0, np.ones(2))], "a": [(0, np.ones(2))]}, buckets=2)
    write_tf_histograms(tmp_path / "a", {"y": [(0, np.ones(2))], "x": [(3, np.ones(2))]}, buckets=2)
    write_tf_histograms(tmp_path / "a", {"x": [(0, np.ones(2))], "w": [(0, np.ones(2))]}, buckets=2)
    assert list(events.read_histograms(tmp_path)) == ["y", "x", "w", "z", "a"]
    assert [s for s, _, _ in events.read_histograms(tmp_path)["x"]] == [0, 3]  # sorted by step


def test_histograms_keep_the_latest_per_step(tmp_path):
    write_tf_histograms(tmp_path, {"w": [(0, np.ones(3)), (5, np.ones(3))]}, buckets=4)
    write_tf_histograms(tmp_path, {"w": [(5, np.full(6, 2.0)), (9, np.ones(2))]}, buckets=4)  # a resume
    got = events.read_histograms(tmp_path)["w"]
    assert [(s, sum(c for *_, c in b), len(b)) for s, _, b in got] == [(0, 3, 4), (5, 6, 4), (9, 2, 4)]
    assert got[1][2][-1] == (2.0, 2.0, 6.0)  # the constant's count sits in the last bucket


def test_the_trainers_own_histograms_are_read(tmp_path):
    from pipelines.train.events import histogram_table, write_histogram

    values = np.linspace(-1.0, 1.0, 50)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=4):
        write_histogram("weights/dense/kernel", values, buckets=5)
    writer.close()
    ((step, _, buckets),) = events.read_histograms(tmp_path)["weights/dense/kernel"]
    assert step == 4 and buckets == [tuple(row) for row in histogram_table(values, 5).tolist()]


def test_reads_tf1_simple_values_and_histogram_protos(tmp_path):
    histo = tf.compat.v1.HistogramProto(min=-1.0, max=4.0, num=6, bucket_limit=[0.0, 2.0, 1.7e308], bucket=[1, 3, 2])
    summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag="legacy", histo=histo),
                                          tf.compat.v1.Summary.Value(tag="old/loss", simple_value=0.5)])
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=3)
    writer.close()
    got = events.read_events(tmp_path)
    assert got.histograms["legacy"][0][::2] == (3, [(-1.0, 0.0, 1.0), (0.0, 2.0, 3.0), (2.0, 4.0, 2.0)])
    assert [(s, v) for s, _, v in got.scalars["old/loss"]] == [(3, 0.5)]


@pytest.mark.parametrize("where", ["header", "payload", "crc"])
def test_a_truncated_file_is_read_up_to_the_cut(tmp_path, where):
    path = write_tf_events(tmp_path / "full", {"train/loss": [(s, float(s)) for s in range(6)]})
    data = path.read_bytes()
    # Cut into the record of step 5 as a killed writer would (dropping the records after it).
    start, length = record_offsets(data)[steps_of(path).index(5)]
    stop = {"header": start + 7, "payload": start + 12 + length // 2, "crc": start + 12 + length + 2}[where]
    trunc = tmp_path / "trunc" / path.name
    trunc.parent.mkdir()
    trunc.write_bytes(data[:stop])
    assert [(s, v) for s, _, v in events.read_scalars(trunc.parent)["train/loss"]] == [(s, float(s)) for s in range(5)]


def test_a_corrupt_record_ends_its_file_and_other_files_are_still_read(tmp_path):
    path = write_tf_events(tmp_path, {"train/loss": [(s, float(s)) for s in range(4)]})
    data = bytearray(path.read_bytes())
    start, _ = record_offsets(bytes(data))[steps_of(path).index(2)]
    data[start + 14] ^= 0xFF  # a byte inside the payload of step 2's record: its checksum fails
    path.write_bytes(bytes(data))
    write_tf_events(tmp_path, {"train/loss": [(7, 7.0)]})  # a later file in the same run folder
    assert [s for s, _, _ in events.read_scalars(tmp_path)["train/loss"]] == [0, 1, 7]


def test_a_malformed_histogram_is_skipped_with_a_warning(tmp_path, caplog):
    metadata = tf.compat.v1.SummaryMetadata(plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="histograms"))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.write("bad/hist", tf.constant([1.0, 2.0]), step=1, metadata=metadata)
        tf.summary.histogram("good/hist", [1.0, 2.0], step=1, buckets=2)
    writer.close()
    with caplog.at_level(logging.WARNING, logger="pipelines.analyze.events"):
        got = events.read_histograms(tmp_path)
    assert list(got) == ["good/hist"]
    assert "'bad/hist' has shape [2], not [k, 3]" in caplog.text


def test_an_empty_folder_has_no_events_and_a_missing_one_raises(tmp_path):
    (tmp_path / "empty" / "nested").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("not an event file")
    assert events.read_events(tmp_path / "empty") == events.Events({}, {})
    with pytest.raises(events.EventsNotFoundError, match="nowhere"):
        events.read_scalars(tmp_path / "nowhere")


def test_one_file_a_str_and_a_file_uri_read_alike(tmp_path):
    path = write_tf_events(tmp_path, {"a": [(1, 2.0), (2, 3.0)]})
    write_tf_events(tmp_path, {"a": [(3, 4.0)]})
    assert [s for s, _, _ in events.read_scalars(path)["a"]] == [1, 2]  # that file alone
    assert events.read_events(str(tmp_path)) == events.read_events(tmp_path) == events.read_events(tmp_path.as_uri())
    assert [s for s, _, _ in events.read_scalars(tmp_path)["a"]] == [1, 2, 3]
