"""The model store: immutable versions, one per run, never half visible, and the promoted pointer
(docs/ARCHITECTURE.md, "Model versions and promotion")."""

from __future__ import annotations

import json
import os

import pytest

from pipelines.errors import StageError
from pipelines.stores.models import ModelStore, list_folder


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


def _publish_at_once(store_uri: str, model_files: dict, process: int, start, results) -> None:
    """Three runs' publishes, one after the other, in a process of its own started with the others
    (``start`` barrier)."""
    store = ModelStore(store_uri)
    start.wait()
    for j in range(3):
        key = f"run-{process}-{j}"
        results.put((key, store.publish("cnn", model_files, {"run_id": key}, run_key=key)["version"]))


def test_runs_publishing_at_once_each_get_a_version_of_their_own(tmp_path, model_files):
    """Six processes publish three runs each, all at the same time (a backfill runs several runs at
    a time): 18 versions, each holding its own run's files and metadata; a retry of any run returns
    the version it made.  (Before claims had candidates, two runs could take one number.)"""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(6), ctx.Queue()
    uri = str(tmp_path / "store")
    procs = [ctx.Process(target=_publish_at_once, args=(uri, model_files, i, start, results)) for i in range(6)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=300) for _ in range(18))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(set(got.values())) == 18, got  # no two runs in one version
    store = ModelStore(uri)
    metas = {m["version"]: m for m in store.versions("cnn")}
    assert set(metas) == set(got.values())
    assert all(metas[v]["run_id"] == key == metas[v]["run_key"] for key, v in got.items())
    for key, version in got.items():  # each claim names its own run, and a retry finds it
        assert json.loads((tmp_path / "store" / "cnn" / version / "claim.json").read_text())["run_key"] == key
        assert store.publish("cnn", model_files, {"run_id": key}, run_key=key)["version"] == version


def test_a_number_every_candidate_withdrew_from_is_taken_again_and_a_held_one_is_not(tmp_path, model_files):
    store = ModelStore(str(tmp_path / "store"))
    store.publish("cnn", model_files, {"run_id": "r1"}, run_key="k1")
    # two runs asked for v0002 at once and both withdrew: the folder is there, nobody holds it
    (tmp_path / "store" / "cnn" / "v0002" / "claims").mkdir(parents=True)
    assert store.publish("cnn", model_files, {"run_id": "r2"}, run_key="k2")["version"] == "v0002"
    # a run that stopped between its candidate and claim.json holds v0003: the next run skips it
    stale = tmp_path / "store" / "cnn" / "v0003" / "claims"
    stale.mkdir(parents=True)
    (stale / "0123.json").write_text(json.dumps({"run_key": "gone"}))
    assert store.publish("cnn", model_files, {"run_id": "r3"}, run_key="k3")["version"] == "v0004"
    # a run that finds another candidate beside its own withdraws it and does not win the number
    (tmp_path / "store" / "cnn" / "v0005" / "claims").mkdir(parents=True)
    (tmp_path / "store" / "cnn" / "v0005" / "claims" / "other.json").write_text(json.dumps({"run_key": "other"}))
    assert not store._try_claim("cnn", "v0005", "k5")
    assert sorted(p.name for p in (tmp_path / "store" / "cnn" / "v0005" / "claims").iterdir()) == ["other.json"]
    assert not (tmp_path / "store" / "cnn" / "v0005" / "claim.json").exists()


class CreatedWhileListed:
    """The local filesystem, where another process creates the listed folder in the instant between
    pyarrow's failed listing and its look for the folder: what ``allow_not_found`` then raises
    (FileNotFoundError; reproduced with a process creating folders while another lists them)."""

    def __init__(self, folder):
        import pyarrow.fs as pafs

        self.fs, self.folder, self.raised = pafs.LocalFileSystem(), folder, 0

    def get_file_info(self, selector):
        if not self.raised:
            self.raised += 1
            self.folder.mkdir()
            (self.folder / "v0001").mkdir()
            raise FileNotFoundError(f"Cannot list directory '{self.folder}'. Detail: [errno 2] No such file or directory")
        return self.fs.get_file_info(selector)


def test_a_folder_created_while_it_is_listed_is_listed_again_not_an_error(tmp_path):
    fs = CreatedWhileListed(tmp_path / "cnn")
    assert [i.base_name for i in list_folder(fs, str(tmp_path / "cnn"))] == ["v0001"] and fs.raised == 1
    assert list_folder(fs, str(tmp_path / "absent")) == []  # no folder: nothing, as before
