"""A parameter-server run's updates file and figures (pipelines.analyze.updates)."""

from __future__ import annotations

import json

import pytest

from analyze.synthetic import (
    ps_updates,
    write_updates,
)
from pipelines.errors import DataError

pytestmark = pytest.mark.trainer


def test_updates_file_errors_name_the_file_line_and_field(tmp_path):
    from pipelines.analyze.updates import check_parameter_server, read_updates

    path = tmp_path / "updates.jsonl"
    rows = ps_updates()[:3]
    write_updates(path, rows, tail='{"i": 3, "worker": 0, "staleness"')
    assert read_updates(path) == rows  # a last line cut off mid-write is left out
    assert read_updates(path.as_uri()) == rows
    write_updates(path, [rows[0], {**rows[1], "staleness": "2"}, rows[2]])
    with pytest.raises(DataError, match=r"updates.jsonl line 2: field 'staleness' must be an integer \(got '2'\)"):
        read_updates(path)
    path.write_text(json.dumps(rows[0]) + "\nnot json\n" + json.dumps(rows[1]) + "\n")
    with pytest.raises(DataError, match="updates.jsonl line 2: not a JSON object"):
        read_updates(path)
    with pytest.raises(FileNotFoundError):
        read_updates(tmp_path / "missing.jsonl")
    bad = {"parameter_server": {"staleness_histogram": [3, -1]}}
    with pytest.raises(DataError, match=r"train/result.json: field parameter_server.staleness_histogram"):
        check_parameter_server(bad, "train/result.json")
    with pytest.raises(DataError, match=r"parameter_server.workers\[0\].worker must be an integer"):
        check_parameter_server({"parameter_server": {"workers": [{"device": "fast"}]}}, "train result")
