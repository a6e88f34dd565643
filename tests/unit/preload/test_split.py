"""The held-out split (pipelines.preload.split)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.preload.split import holdout_mask

pytestmark = pytest.mark.trainer


def test_holdout_mask_is_stable_and_seeded():
    keys = np.arange(100_000)
    m = holdout_mask(keys, 7, 0.2)
    assert 0.19 < m.mean() < 0.21
    np.testing.assert_array_equal(m, holdout_mask(keys, 7, 0.2))
    np.testing.assert_array_equal(m[500:600], holdout_mask(keys[500:600], 7, 0.2))
    assert (m != holdout_mask(keys, 8, 0.2)).mean() > 0.2
