"""publish, the comparison in analyze and promote (pipelines.promote.stage) on real SavedModels
(docs/ARCHITECTURE.md, "Model versions and promotion")."""

from __future__ import annotations

import json

import pytest

from pipelines.errors import StageError
from pipelines.promote.stage import decide
from pipelines.stores.models import ModelStore
from promote.versions import finished_run, holdout_shards, publish_analyze_promote, spec

pytestmark = pytest.mark.trainer
tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return holdout_shards(tmp_path_factory.mktemp("holdout"))


def test_a_better_or_equal_version_is_promoted_and_a_worse_one_is_not(tmp_path, shards):
    store_dir = tmp_path / "store"
    job = spec(store_dir)
    good = finished_run(tmp_path, "good", 1.0, shards)
    first = publish_analyze_promote(good, job, "r1")
    assert first["promoted"] and first["version"] == "v0001" and first["previous"] is None
    meta = json.loads((store_dir / "tiny_mlp" / "v0001" / "metadata.json").read_text())
    assert meta["run_id"] == "r1" and meta["train_input_key"] == "t-good" and meta["devices"][1] == {"device": "slow", "batch": 24}
    # the final checkpoint only: the index names ckpt-3, the older ones stay behind
    assert sorted(p.name for p in (store_dir / "tiny_mlp" / "v0001" / "checkpoint").iterdir()) == [
        "checkpoint", "ckpt-3.data-00000-of-00001", "ckpt-3.index"]

    bad = finished_run(tmp_path, "bad", 0.0, shards)
    second = publish_analyze_promote(bad, job, "r2")
    analysis = json.loads(bad.result_path("analyze").read_text())
    comparison = analysis["comparison"]
    assert comparison["promoted"]["version"] == "v0001" and comparison["new"]["version"] == "v0002"
    assert comparison["new"]["accuracy"] < comparison["promoted"]["accuracy"] - 0.01
    assert not comparison["promotable"] and "more than the tolerance" in comparison["reason"]
    assert not second["promoted"] and ModelStore(str(store_dir)).promoted("tiny_mlp")["version"] == "v0001"
    report = (bad.root / "analyze" / "report.html").read_text()
    assert "<h2>Model versions</h2>" in report and "promoted: v0001" in report and "may not replace it" in report

    # A looser tolerance lets it through; mode never publishes only.
    lenient = spec(store_dir, promotion={"tolerance": 1.0})
    assert publish_analyze_promote(bad, lenient, "r2")["promoted"]
    assert ModelStore(str(store_dir)).promoted("tiny_mlp")["version"] == "v0002"
    never = spec(store_dir, promotion={"mode": "never"})
    again = publish_analyze_promote(good, never, "r1")
    assert again["version"] == "v0001" and not again["promoted"] and "never" in again["reason"]  # the same version


def test_decide_needs_a_comparison_of_this_runs_version(tmp_path, shards):
    assert decide("never", "v0002", None) == (False, "promotion.mode is never: published only")
    with pytest.raises(StageError, match="no comparison"):
        decide("auto", "v0002", None)
    with pytest.raises(StageError, match="analyze compared v0001, but this run published v0002"):
        decide("auto", "v0002", {"new": {"version": "v0001"}, "promotable": True, "reason": ""})


def test_overlapping_runs_compare_again_against_the_version_promoted_in_between(tmp_path, shards):
    """A backfill's runs overlap: two runs analyse against v0001, the first promotes v0002, and the
    second's comparison is stale.  Its promote compares again, against v0002 on its own held-out
    rows: a worse version is not promoted, a good one is, and each result says it compared again."""
    from pipelines.core.stages import StageContext
    from pipelines.promote.stage import run as promote
    from pipelines.stores.rundir import write_json

    store_dir = tmp_path / "store"
    job = spec(store_dir)
    assert publish_analyze_promote(finished_run(tmp_path, "first", 1.0, shards), job, "r1")["version"] == "v0001"
    later = [finished_run(tmp_path, name, quality, shards) for name, quality in (("a", 1.0), ("b", 0.0), ("c", 1.0))]
    for rd, run_id in zip(later, ("ra", "rb", "rc"), strict=True):  # publish and analyze, all before any promote
        ctx = StageContext(dag_id="d", run_id=run_id)
        from pipelines.analyze.stage import run as analyze
        from pipelines.publish.stage import run as publish

        write_json(rd.result_path("publish"), publish(job, rd, ctx))
        write_json(rd.result_path("analyze"), analyze(job, rd, ctx))
        assert json.loads(rd.result_path("analyze").read_text())["comparison"]["promoted"]["version"] == "v0001"
    a, b, c = (promote(job, rd, StageContext(dag_id="d", run_id=r)) for rd, r in zip(later, ("ra", "rb", "rc"), strict=True))
    assert a["promoted"] and a["version"] == "v0002" and a["recompared"] == []  # its comparison was current
    # b guesses (accuracy 0): against v0002, promoted since its analyze, it is still worse
    assert not b["promoted"] and b["recompared"] == ["v0002"] and b["previous"] == "v0002"
    assert b["reason"].startswith("compared again: held-out accuracy") and "more than the tolerance" in b["reason"]
    # c is as good as v0002: promoted after comparing again
    assert c["promoted"] and c["version"] == "v0004" and c["recompared"] == ["v0002"] and c["previous"] == "v0002"
    assert ModelStore(str(store_dir)).promoted("tiny_mlp")["version"] == "v0004"
