"""The model store: immutable versions, one per run, never half visible, and the promoted pointer
(docs/ARCHITECTURE.md, "Model versions and promotion")."""

from __future__ import annotations

import json
import os

import pytest

from pipelines.errors import StageError
from pipelines.stores.models import ModelStore


@pytest.fixture
def model_files(tmp_path):
    saved = tmp_path / "train" / "saved_model"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"graph")
    (saved / "variables" / "variables.index").write_bytes(b"index")
    weights = tmp_path / "train" / "model.weights.h5"
    weights.write_bytes(b"weights")
    return {"saved_model": saved, "model.weights.h5": weights}


def test_publish_makes_numbered_versions_with_metadata_written_last(tmp_path, model_files):
    store = ModelStore(str(tmp_path / "store"))
    first = store.publish("cnn", model_files, {"run_id": "r1"}, run_key="k1")
    second = store.publish("cnn", model_files, {"run_id": "r2"}, run_key="k2")
    assert (first["version"], second["version"]) == ("v0001", "v0002")
    base = tmp_path / "store" / "cnn" / "v0002"
    assert (base / "saved_model" / "variables" / "variables.index").read_bytes() == b"index"
    assert (base / "model.weights.h5").read_bytes() == b"weights"
    meta = json.loads((base / "metadata.json").read_text())
    assert meta["run_id"] == "r2" and meta["uri"] == str(base) and meta["files"] == ["model.weights.h5", "saved_model"]
    assert [v["version"] for v in store.versions("cnn")] == ["v0001", "v0002"]
    assert oct(os.stat(base / "metadata.json").st_mode & 0o777) == "0o644"


def test_a_retry_of_the_same_run_returns_its_version_and_finishes_a_half_copied_one(tmp_path, model_files):
    store = ModelStore(str(tmp_path / "store"))
    done = store.publish("cnn", model_files, {"run_id": "r1"}, run_key="k1")
    assert store.publish("cnn", model_files, {"run_id": "r1"}, run_key="k1") == done  # no second version
    # A try that died after claiming v0002 and copying part of it: the version is not visible ...
    claimed = store._claim("cnn", "k2")
    (tmp_path / "store" / "cnn" / claimed / "model.weights.h5").write_bytes(b"half")
    assert [v["version"] for v in store.versions("cnn")] == ["v0001"]
    with pytest.raises(StageError, match="no complete version 'v0002'"):
        store.version("cnn", "v0002")
    # ... and the retry finishes that same version instead of making v0003.
    again = store.publish("cnn", model_files, {"run_id": "r2"}, run_key="k2")
    assert again["version"] == "v0002" == claimed
    assert (tmp_path / "store" / "cnn" / "v0002" / "model.weights.h5").read_bytes() == b"weights"
    assert [v["version"] for v in store.versions("cnn")] == ["v0001", "v0002"]


def test_promote_replaces_the_pointer_in_one_write(tmp_path, model_files):
    store = ModelStore(str(tmp_path / "store"))
    assert store.promoted("cnn") is None
    for key in ("k1", "k2"):
        store.publish("cnn", model_files, {}, run_key=key)
    first = store.promote("cnn", "v0001", run_id="r1")
    assert first["previous"] is None and store.promoted("cnn")["version"] == "v0001"
    second = store.promote("cnn", "v0002", run_id="r2")
    assert second["previous"] == "v0001" and store.promoted("cnn")["version"] == "v0002"
    assert sorted(p.name for p in (tmp_path / "store" / "cnn").iterdir()) == ["PROMOTED.json", "v0001", "v0002"]
    with pytest.raises(StageError, match="no complete version 'v0009'"):
        store.promote("cnn", "v0009")


def test_download_is_the_path_itself_on_a_local_store(tmp_path, model_files):
    store = ModelStore(f"file://{tmp_path}/store")
    store.publish("cnn", model_files, {}, run_key="k1")
    path = store.download("cnn", "v0001", "model.weights.h5", tmp_path / "scratch")
    assert path.read_bytes() == b"weights"
    with pytest.raises(StageError, match="cnn v0001 has no checkpoint"):
        store.download("cnn", "v0001", "checkpoint", tmp_path / "scratch")


def test_missing_sources_and_unusable_stores_are_named(tmp_path, model_files):
    store = ModelStore(str(tmp_path / "store"))
    with pytest.raises(StageError, match="does not exist"):
        store.publish("cnn", {**model_files, "checkpoint/ckpt-1.index": tmp_path / "nope"}, {}, run_key="k")
    with pytest.raises(StageError, match="model_store 'nosuch://bucket/models': cannot open it"):
        ModelStore("nosuch://bucket/models")
