"""Event parsing (pipelines.analyze.events), against files TensorFlow wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analyze.synthetic import (
    write_tf_events,
    write_tf_histograms,
)
from pipelines.analyze import events

pytestmark = pytest.mark.trainer

tf = pytest.importorskip("tensorflow")
pa = pytest.importorskip("pyarrow")


def test_crc32c_matches_the_standard_check_value():
    assert events.crc32c(b"123456789") == 0xE3069283
    assert events.crc32c(b"") == 0


def test_reads_tf2_tensor_scalars_across_files_and_tags(tmp_path):
    logdir = tmp_path / "events"
    write_tf_events(
        logdir, {"train/loss": [(s, 1.0 / (s + 1)) for s in range(5)], "rank0/batch": [(0, 24.0)]}
    )
    write_tf_events(logdir, {"train/loss": [(s, 0.1) for s in range(5, 8)]})
    write_tf_events(logdir / "sub", {"train/learning_rate": [(3, 0.125)]}, dtype=tf.float64)

    scalars = events.read_scalars(logdir)

    assert set(scalars) == {"train/loss", "rank0/batch", "train/learning_rate"}
    loss = scalars["train/loss"]
    assert [p[0] for p in loss] == list(range(8))
    np.testing.assert_allclose([p[2] for p in loss], [1.0, 0.5, 1 / 3, 0.25, 0.2, 0.1, 0.1, 0.1], rtol=1e-6)
    assert all(p[1] > 1e9 for p in loss)  # wall times in seconds since the epoch
    assert scalars["rank0/batch"] == [(0, pytest.approx(scalars["rank0/batch"][0][1]), 24.0)]
    assert scalars["train/learning_rate"][0][2] == 0.125  # DT_DOUBLE kept exactly


def test_repeated_step_keeps_the_latest_value(tmp_path):
    write_tf_events(tmp_path, {"train/loss": [(0, 5.0), (1, 4.0)]})
    write_tf_events(tmp_path, {"train/loss": [(1, 3.0), (2, 2.0)]})  # resumed run repeats step 1
    assert [(s, v) for s, _, v in events.read_scalars(tmp_path)["train/loss"]] == [
        (0, 5.0),
        (1, 3.0),
        (2, 2.0),
    ]


def test_file_uri_goes_through_pyarrow_and_matches_local(tmp_path):
    write_tf_events(tmp_path, {"a": [(1, 2.0), (2, 3.0)]})
    assert events.read_scalars(tmp_path.as_uri()) == events.read_scalars(tmp_path)
    fs = pa.fs.LocalFileSystem()
    assert events.read_scalars(str(tmp_path), fs=fs)["a"][1][2] == 3.0


@pytest.mark.parametrize("where", ["header", "payload", "crc"])
def test_truncated_tail_is_ignored(tmp_path, where):
    path = write_tf_events(tmp_path / "full", {"train/loss": [(s, float(s)) for s in range(6)]})
    data = path.read_bytes()
    records = list(events.iter_records(data))
    # Cut into the record of step 5 as a killed writer would (dropping the records after it).
    start, payload = next((o, p) for o, p in records if events.parse_event(p)[0] == 5)
    stop = {
        "header": start + 7,
        "payload": start + 12 + len(payload) // 2,
        "crc": start + 12 + len(payload) + 2,
    }
    trunc = tmp_path / "trunc" / path.name
    trunc.parent.mkdir()
    trunc.write_bytes(data[: stop[where]])
    assert [p[0] for p in events.read_scalars(trunc.parent)["train/loss"]] == [0, 1, 2, 3, 4]


def test_corrupt_record_in_the_middle_names_file_and_offset(tmp_path):
    path = write_tf_events(tmp_path, {"train/loss": [(s, float(s)) for s in range(4)]})
    data = bytearray(path.read_bytes())
    offset = [o for o, _ in events.iter_records(bytes(data))][2]
    data[offset + 14] ^= 0xFF  # a byte inside the payload of the third record
    path.write_bytes(bytes(data))
    with pytest.raises(events.EventFileError) as err:
        events.read_scalars(tmp_path)
    assert path.name in str(err.value) and f"offset {offset}" in str(err.value)
    # Without verification the framing still holds and the other records are read.
    assert len(events.read_scalars(tmp_path, verify=False)["train/loss"]) >= 3


def tf_decoded(path: Path) -> dict[str, list[tuple[int, list]]]:
    """What TensorFlow's own parser finds in an event file: ``tag -> [(step, [k, 3] rows)]``."""
    out: dict[str, list] = {}
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name == "histograms":
                out.setdefault(v.tag, []).append((event.step, tf.make_ndarray(v.tensor).tolist()))
    return out


def test_reads_tf2_histograms_as_tensorflow_decodes_them(tmp_path):
    rng = np.random.default_rng(0)
    kernel = [(s, rng.normal(s, 1.0, (6, 5)).astype(np.float32)) for s in (0, 10, 20)]
    path = write_tf_histograms(tmp_path, {"weights/d/kernel": kernel, "weights/d/bias": [(0, np.zeros(4, np.float32))]})
    write_tf_events(tmp_path, {"train/loss": [(0, 1.0)]})  # scalars (and other/histogram) beside them

    got = events.read_histograms(tmp_path)

    assert list(got) == ["weights/d/kernel", "weights/d/bias", "other/histogram"]  # first-written order
    assert set(events.read_scalars(tmp_path)) == {"train/loss"}
    expected = tf_decoded(path)
    for tag in ("weights/d/kernel", "weights/d/bias"):
        assert [(s, [list(b) for b in buckets]) for s, _, buckets in got[tag]] == expected[tag]
    for (step, values), (s, wall, buckets) in zip(kernel, got["weights/d/kernel"], strict=True):
        assert s == step and wall > 1e9 and len(buckets) == 30  # TF 2.15's default bucket count
        assert sum(c for _, _, c in buckets) == 30
        assert (buckets[0][0], buckets[-1][1]) == pytest.approx((values.min(), values.max()))
    assert sum(c for _, _, c in got["other/histogram"][0][2]) == 3


def test_histograms_keep_the_latest_per_step_and_read_through_pyarrow(tmp_path):
    write_tf_histograms(tmp_path, {"w": [(0, np.ones(3)), (5, np.ones(3))]}, buckets=4)
    write_tf_histograms(tmp_path, {"w": [(5, np.full(6, 2.0)), (9, np.ones(2))]}, buckets=4)  # a resume
    got = events.read_histograms(tmp_path)["w"]
    assert [(s, sum(c for *_, c in b), len(b)) for s, _, b in got] == [(0, 3, 4), (5, 6, 4), (9, 2, 4)]
    assert got[1][2][-1] == (2.0, 2.0, 6.0)  # the constant's count sits in the last bucket
    assert events.read_histograms(tmp_path.as_uri()) == events.read_histograms(tmp_path)
    assert events.read_events(str(tmp_path), fs=pa.fs.LocalFileSystem()).histograms == events.read_histograms(tmp_path)


def test_reads_tf1_histogram_protos(tmp_path):
    histo = tf.compat.v1.HistogramProto(min=-1.0, max=4.0, num=6, bucket_limit=[0.0, 2.0, 1.7e308], bucket=[1, 3, 2])
    summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag="legacy", histo=histo)])
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=3)
    writer.close()
    assert events.read_histograms(tmp_path)["legacy"][0][::2] == (3, [(-1.0, 0.0, 1.0), (0.0, 2.0, 3.0), (2.0, 4.0, 2.0)])


def test_malformed_histogram_names_the_tag_file_and_offset(tmp_path):
    metadata = tf.compat.v1.SummaryMetadata(plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="histograms"))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.write("bad/hist", tf.constant([1.0, 2.0]), step=1, metadata=metadata)
    writer.close()
    with pytest.raises(events.EventFileError, match=r"events\.out\.tfevents.*offset \d+: histogram 'bad/hist'.*\[2\]"):
        events.read_histograms(tmp_path)


def test_missing_event_folder_raises_naming_it(tmp_path):
    with pytest.raises(events.EventsNotFoundError, match="nowhere"):
        events.read_scalars(tmp_path / "nowhere")


def test_events_module_does_not_import_tensorflow(tmp_path):
    write_tf_events(tmp_path, {"x": [(0, 1.0)]})
    code = (
        "import sys, pipelines.analyze.events as e; "
        f"s, h = e.read_events({str(tmp_path)!r}); assert s['x'][0][2] == 1.0, s; "
        "assert sum(c for *_, c in h['other/histogram'][0][2]) == 3, h; "
        "assert 'tensorflow' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
