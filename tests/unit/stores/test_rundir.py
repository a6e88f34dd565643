"""Files of the run directory: written whole or not at all, and all with one permission rule."""

from __future__ import annotations

import json
import os
import stat

import pytest

from pipelines.stores.rundir import write_json, write_text


def test_json_and_text_files_get_the_same_permissions_from_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        spec = write_json(tmp_path / "spec.json", {"a": 1})
        report = write_text(tmp_path / "report.html", "<html></html>")
    finally:
        os.umask(old)
    assert stat.S_IMODE(spec.stat().st_mode) == stat.S_IMODE(report.stat().st_mode) == 0o644
    assert json.loads(spec.read_text()) == {"a": 1}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = write_json(tmp_path / "result.json", {"old": True})
    with pytest.raises(TypeError):
        write_json(target, {"bad": object.__new__(type("NotJson", (), {"__str__": None}))})
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
