"""Held-out evaluation (pipelines.models.evaluate)."""

from __future__ import annotations

import numpy as np
import pytest
from analyze.synthetic import (
    write_shard,
)

from pipelines.errors import DataError
from pipelines.models.evaluate import confusion_metrics, iter_holdout

pytestmark = pytest.mark.trainer

tf = pytest.importorskip("tensorflow")
pa = pytest.importorskip("pyarrow")


def test_confusion_metrics_and_empty_class():
    m = confusion_metrics([[3, 1, 0], [0, 0, 0], [1, 0, 5]])
    assert m["accuracy"] == pytest.approx(0.8) and m["rows"] == 10
    assert m["per_class_accuracy"] == [0.75, None, pytest.approx(5 / 6)]


def test_holdout_shard_with_wrong_feature_size_names_the_file(tmp_path):
    path = write_shard(tmp_path / "bad.arrow", np.zeros((3, 9), np.float32), np.zeros(3, np.int32))
    with pytest.raises(DataError, match="bad.arrow"):
        list(iter_holdout([path], feature_size=16))
