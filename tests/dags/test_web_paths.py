"""What the pages inside Airflow may serve (``hetero.web.paths``), where they are
(``hetero.web.urls``), and the links and tabs that lead to them (``hetero.links``, the plugin).
The app itself, behind the api-server's authentication, is tested on a real Airflow in
tests/integration/airflow/test_web.py."""

from __future__ import annotations

import importlib
import os
import urllib.parse
from pathlib import Path

import pytest

from hetero.links import stage_links
from hetero.web.paths import (
    Refused,
    effective_artifact_root,
    entries,
    history_path,
    relative_parts,
    resolve_inside,
    run_folder,
)
from hetero.web.urls import files_url, report_url, root_path, tab_views, web_links_enabled
from pipelines.spec import SpecError, load_spec

RUN = "manual__2026-01-01T00:00:00+00:00"


@pytest.fixture
def runs(tmp_path) -> tuple[Path, Path]:
    """Two runs' folders under one artifact root, each with a report; a secret beside the root."""
    root = tmp_path / "artifacts"
    mine, other = run_folder(root, "train_pipeline", RUN), run_folder(root, "train_pipeline", "other")
    for folder in (mine, other):
        (folder / "analyze").mkdir(parents=True)
        (folder / "analyze" / "report.html").write_text(f"<h1>{folder.name}</h1>")
    (tmp_path / "secret.txt").write_text("not for the web")
    return mine, other


@pytest.mark.parametrize("path", ["..", "../other/analyze/report.html", "analyze/../../other", "a/./b", ".",
                                  "/etc/passwd", "//etc/passwd", "analyze\\..\\..\\x", "analyze/report.html\x00.png"])
def test_a_path_that_is_not_plain_and_relative_is_refused(path):
    with pytest.raises(Refused) as refused:
        relative_parts(path)
    assert refused.value.status == 403 and repr(path) in refused.value.reason


def test_plain_relative_paths_are_split_into_their_segments():
    assert relative_parts("analyze/report.html") == ["analyze", "report.html"]
    assert relative_parts("train//events/") == ["train", "events"]
    assert relative_parts("") == [] and relative_parts("...x/..y") == ["...x", "..y"]  # names, not traversals


def test_files_of_the_run_are_served_and_links_inside_it_are_followed(runs):
    mine, _ = runs
    assert resolve_inside(mine, "analyze/report.html") == (mine / "analyze" / "report.html").resolve()
    assert resolve_inside(mine, "") == mine.resolve() and resolve_inside(mine, "analyze/") == (mine / "analyze").resolve()
    (mine / "latest.html").symlink_to(mine / "analyze" / "report.html")
    (mine / "reports").symlink_to("analyze", target_is_directory=True)
    assert resolve_inside(mine, "latest.html").read_text() == f"<h1>{mine.name}</h1>"
    assert resolve_inside(mine, "reports/report.html") == (mine / "analyze" / "report.html").resolve()


def test_links_out_of_the_run_are_refused_and_missing_things_are_not_found(runs, tmp_path):
    mine, other = runs
    (mine / "theirs.html").symlink_to(other / "analyze" / "report.html")  # another run of the same DAG
    (mine / "secret").symlink_to(tmp_path / "secret.txt")
    (mine / "etc").symlink_to("/etc", target_is_directory=True)
    (mine / "gone").symlink_to(tmp_path / "nothing-here")  # a dangling link out: refused, not "missing"
    (mine / "loop").symlink_to(mine / "loop")
    os.mkfifo(mine / "fifo")
    for path in ("theirs.html", "secret", "etc/hostname", "etc", "gone"):
        with pytest.raises(Refused) as refused:
            resolve_inside(mine, path)
        assert refused.value.status == 403 and "points outside the run's folder" in refused.value.reason, path
    with pytest.raises(Refused) as refused:
        resolve_inside(mine, "fifo")
    assert refused.value.status == 403 and "neither a regular file nor a folder" in refused.value.reason
    for path in ("analyze/missing.html", "loop"):
        with pytest.raises(Refused) as refused:
            resolve_inside(mine, path)
        assert refused.value.status == 404, path
    with pytest.raises(Refused) as refused:
        resolve_inside(mine.parent / "not-yet", "analyze/report.html")
    assert refused.value.status == 404 and "does not exist" in refused.value.reason
    # the listing shows what would be served, folders first, and none of the links out
    assert [(e.name, e.is_dir) for e in entries(mine.resolve(), mine)] == [("analyze", True)]


def test_the_run_folder_and_history_page_are_named_as_the_stages_name_them(tmp_path):
    assert run_folder(f"file://{tmp_path}", "train_pipeline", RUN) == (
        tmp_path / "train_pipeline" / "manual__2026-01-01T00_00_00+00_00")
    assert history_path(tmp_path, "train_pipeline") == tmp_path / "train_pipeline" / "history.html"


def test_the_artifact_root_is_the_one_the_runs_tasks_used(tmp_path):
    defaults = load_spec({"dataset": {"uri": "/data"}, "artifact_root": str(tmp_path / "deployment")}).model_dump(mode="json")
    base = tmp_path / "project"
    assert effective_artifact_root({}, defaults, base) == tmp_path / "deployment"
    # the run's params (the DAG's, the conf over them): the conf's root wins; a missing value
    # (None, as Airflow dumps a param that does not validate) and a profiling param are left out
    params = {"artifact_root": str(tmp_path / "conf"), "size": "tiny", "training": None}
    assert effective_artifact_root(params, defaults, base) == tmp_path / "conf"
    assert effective_artifact_root({"artifact_root": "file://" + str(tmp_path / "u")}, defaults, base) == tmp_path / "u"
    assert effective_artifact_root({"artifact_root": "runs"}, defaults, base) == base / "runs"  # where stages run
    # a root no task would have accepted has no folder
    fenced = {**defaults, "allowed_roots": [str(tmp_path / "deployment")]}
    with pytest.raises(SpecError, match="artifact_root"):
        effective_artifact_root({"artifact_root": "/etc"}, fenced, base)
    with pytest.raises(SpecError, match="remote URI"):
        effective_artifact_root({"artifact_root": "s3://bucket/runs"}, defaults, base)


def test_urls_of_the_pages_follow_the_api_base_url(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/team/")
    assert report_url("train_pipeline", RUN) == (
        "https://airflow.example/team/hetero/dags/train_pipeline/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00/report")
    assert files_url("d", "r", "train/events/") == "https://airflow.example/team/hetero/dags/d/runs/r/files/train/events/"
    assert root_path() == "/team"
    views = {(v["destination"], v["name"]): v for v in tab_views()}
    assert set(views) == {("dag_run", "Report"), ("task_instance", "Report"), ("dag", "History")}
    assert views[("dag_run", "Report")]["href"] == "/team/hetero/dags/{DAG_ID}/runs/{RUN_ID}/report"
    assert views[("dag", "History")]["href"] == "/team/hetero/dags/{DAG_ID}/history"
    assert len({v["url_route"] for v in views.values()}) == 3  # the UI routes each tab by it
    monkeypatch.delenv("AIRFLOW__API__BASE_URL")
    assert report_url("d", "r") == "/hetero/dags/d/runs/r/report"  # without a base URL: root-relative
    for value, on in (("0", False), ("off", False), ("False", False), ("1", True), ("", True)):
        assert web_links_enabled({"HETERO_WEB_LINKS": value}) is on, value
    assert web_links_enabled({}) is True


def test_the_report_and_events_link_to_the_pages_unless_they_are_switched_off(monkeypatch, tmp_path):
    spec = load_spec({"dataset": {"uri": "/data"}, "artifact_root": str(tmp_path)})
    folder = run_folder(tmp_path, "train_pipeline", RUN)
    report, events = str(folder / "analyze" / "report.html"), str(folder / "train" / "events")
    for name in ("HETERO_ARTIFACT_URL", "HETERO_TENSORBOARD_URL", "HETERO_WEB_LINKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow:8080")
    run = ("train_pipeline", RUN)
    page = "http://airflow:8080/hetero/dags/train_pipeline/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert stage_links("analyze", {"report": report}, spec, None, run=run) == {"Report": page + "/report"}
    assert stage_links("train", {"events_dir": events}, spec, None, run=run) == {
        "TensorBoard events": page + "/files/train/events/"}
    # events outside the run's folder, or a TensorBoard server: not the pages
    assert stage_links("train", {"events_dir": "/x/events"}, spec, None, run=run) == {"TensorBoard events": "file:///x/events"}
    monkeypatch.setenv("HETERO_TENSORBOARD_URL", "http://tb:6006/?runFilter={run_regex}")
    assert stage_links("train", {"events_dir": events}, spec, None, run=run)["TensorBoard events"].startswith("http://tb:6006/")
    monkeypatch.delenv("HETERO_TENSORBOARD_URL")
    monkeypatch.setenv("HETERO_WEB_LINKS", "0")  # switched off: the older links
    assert stage_links("analyze", {"report": report}, spec, None, run=run) == {"Report": "file://" + urllib.parse.quote(report)}
    monkeypatch.setenv("HETERO_ARTIFACT_URL", "https://files.example/a")
    assert stage_links("train", {"events_dir": events}, spec, None, run=run) == {
        "TensorBoard events": "https://files.example/a/train_pipeline/manual__2026-01-01T00_00_00%2B00_00/train/events"}


def test_the_plugin_mounts_the_pages_and_adds_the_tabs_unless_switched_off(monkeypatch):
    import hetero_plugin

    monkeypatch.delenv("HETERO_WEB_LINKS", raising=False)
    plugin = importlib.reload(hetero_plugin).HeteroPipelinePlugin
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/hetero" and callable(app["app"])
    assert {v["url_route"] for v in plugin.external_views} == {"hetero-report", "hetero-task-report", "hetero-history"}
    monkeypatch.setenv("HETERO_WEB_LINKS", "0")
    plugin = importlib.reload(hetero_plugin).HeteroPipelinePlugin
    assert plugin.fastapi_apps == [] and plugin.external_views == []
    monkeypatch.delenv("HETERO_WEB_LINKS")
    importlib.reload(hetero_plugin)
