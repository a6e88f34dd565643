"""The profiling sweep's model family (pipelines.estimate.family): fixed, nested sizes that cover
every kind of network the estimator learns, each member a model the features tell apart."""

from __future__ import annotations

from collections import Counter

import pytest

from pipelines.errors import StageError
from pipelines.estimate import family as fam

pytestmark = pytest.mark.trainer
KIND_OF = {"conv_net": "cnn", "tiny_mlp": "mlp", "residual_cnn": "res", "separable_cnn": "sep", "embedding_net": "emb"}


def test_a_size_is_always_the_same_models_and_a_larger_size_contains_the_smaller():
    sizes = sorted(fam.SIZES, key=lambda s: fam.SIZES[s][0])
    assert sizes == ["tiny", "small", "medium", "large"]
    for smaller, larger in zip(sizes, sizes[1:], strict=False):
        small_ids = [m["id"] for m in fam.family(smaller)]
        assert small_ids == [m["id"] for m in fam.family(larger)][: len(small_ids)]
    for size in sizes:
        members = fam.family(size)
        assert members == fam.family(size) and len(members) == fam.SIZES[size][0]
        assert len({m["id"] for m in members}) == len(members)
        assert all(m["id"].startswith(KIND_OF[m["model"]] + "-") for m in members)


def test_every_kind_is_in_a_small_sweep_and_tiny_stays_three_models():
    assert Counter(m["model"] for m in fam.family("tiny")) == {"conv_net": 1, "tiny_mlp": 1, "residual_cnn": 1}
    small = fam.family("small")
    # at least 3 of every kind (MIN_PER_KIND), so that cross-validation learns a held-out model's kind from 2
    assert Counter(m["model"] for m in small) == {"conv_net": 5, "residual_cnn": 3, "tiny_mlp": 3, "separable_cnn": 3,
                                                  "embedding_net": 3}
    residual = [m["kwargs"] for m in small if m["model"] == "residual_cnn"]
    assert any(k["batch_norm"] for k in residual)
    # no kind has more than the floor while another has fewer; once every kind's share by weight is
    # above the floor, no kind is more than one model off its share
    total = sum(w for _, w in fam.WEIGHTS.values())
    for n in range(1, 2 * fam.SIZES["large"][0]):
        counts = Counter(fam.kinds(n))
        if max(counts.values()) > fam.MIN_PER_KIND:
            assert min(counts[k] for k in fam.WEIGHTS) >= fam.MIN_PER_KIND, (n, counts)
        if all(n * weight / total >= fam.MIN_PER_KIND for _, weight in fam.WEIGHTS.values()):
            for kind, (_, weight) in fam.WEIGHTS.items():
                assert abs(counts[kind] - n * weight / total) <= 1, (n, kind, counts)


def test_an_unknown_size_is_refused():
    with pytest.raises(StageError, match=r"sweep size 'huge' is not one of \['tiny', 'small', 'medium', 'large'\]"):
        fam.family("huge")


def test_the_small_family_builds_and_its_kinds_differ_in_the_features_that_tell_them_apart():
    from pipelines.estimate.features import model_features
    from pipelines.models import build_model

    by_kind: dict[str, list[dict]] = {}
    for m in fam.family("small"):
        model = build_model(m["model"], tuple(m["input_shape"]), fam.NUM_CLASSES, m["kwargs"])
        by_kind.setdefault(KIND_OF[m["model"]], []).append(model_features(model))
    for f in by_kind["cnn"] + by_kind["mlp"]:
        assert f["merge_layers"] == f["norm_layers"] == f["global_pool_layers"] == f["embedding_params"] == 0
        assert f["depth"] == f["num_layers"]
    assert all(f["merge_layers"] > 0 and f["global_pool_layers"] == 1 and f["depth"] < f["num_layers"] for f in by_kind["res"])
    assert all(f["depthwise_flops_per_sample"] > 0 for f in by_kind["sep"])
    assert all(f["embedding_params"] > 0 and f["embedding_bytes_per_sample"] > 0 for f in by_kind["emb"])
    assert any(f["norm_bytes_per_sample"] > 0 for f in by_kind["res"] + by_kind["sep"])
