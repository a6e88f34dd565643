"""The ``progress`` section (pipelines.spec.progress): how often a training shows itself in the task log."""

from __future__ import annotations

import pytest

from pipelines.spec import SpecError, load_spec
from spec.documents import GOOD


def test_the_interval_defaults_to_a_minute_and_is_checked():
    assert load_spec(GOOD).progress.interval_s == 60.0
    assert load_spec({**GOOD, "progress": {"interval_s": 5}}).progress.interval_s == 5.0
    with pytest.raises(SpecError, match=r"progress\.interval_s: .*greater than or equal to 1"):
        load_spec({**GOOD, "progress": {"interval_s": 0.2}})
    with pytest.raises(SpecError, match=r"progress\.every: unknown field"):
        load_spec({**GOOD, "progress": {"every": 5}})
