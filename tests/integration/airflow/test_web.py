"""The pipeline's pages inside Airflow (``hetero.web``) on the real deployment of conftest.py: one
finished run of the training DAG, then its report, files and the DAG's history page over HTTP,
as the UI's tabs and the extra links reach them; what needs no login, what is refused (paths out
of the run's folder, plain or URL-encoded, symbolic links out, another DAG's run); and, with
Debian's Chromium, the Airflow UI itself: log in, open the run's Report tab, the DAG's History.

Requests go out through ``http.client`` with the path exactly as written: a browser or urllib
would remove ``..`` segments before sending them.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import shutil
import sys
import tempfile
import urllib.parse
from pathlib import Path

import pytest

from pipelines.stores.rundir import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_airflow import NOTES, PASSWORD, USER, Airflow, quote  # noqa: E402 (the helpers beside this file)
from test_real_airflow import DAG, task_states  # noqa: E402

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.real_airflow]

# The distribution's Chromium (scripts/setup-chromium.sh installs Debian's), or HETERO_CHROMIUM's.
CHROMIUM = next((Path(p) for p in (os.environ.get("HETERO_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser")
                 if p and Path(p).is_file()), Path("/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@dataclasses.dataclass(frozen=True)
class Finished:
    run_id: str
    folder: Path  # the run's folder
    artifacts: Path  # its artifact root, from the run's conf

    @property
    def pages(self) -> str:
        return f"/hetero/dags/{DAG}/runs/{quote(self.run_id)}"


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def fetch(airflow: Airflow, path: str, token: str | None = None, method: str = "GET", **headers: str) -> Answer:
    """``path`` sent as it is (no ``..`` removed); ``token`` as ``Authorization: Bearer``."""
    conn = http.client.HTTPConnection("127.0.0.1", airflow.port, timeout=60)
    try:
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def finished(airflow, published_run) -> Finished:
    """A finished run of the training DAG, into an artifact root of its own (its conf's): the
    session's published run (conftest.py), which test_real_airflow also checks."""
    run_id, artifacts = published_run.run_id, published_run.artifacts
    state = airflow.api.get(f"/dags/{DAG}/dagRuns/{quote(run_id)}")["state"]
    assert state == "success", task_states(airflow, run_id)
    return Finished(run_id, RunDir.for_run(str(artifacts), DAG, run_id).root, artifacts)


def test_the_pages_need_an_airflow_login(airflow, finished):
    """Airflow's own authentication: no credentials is 401 (a browser is sent to the login page
    and back), a forged token 403; the API's token and the UI's session cookie both work."""
    paths = [f"{finished.pages}/report", f"{finished.pages}/files/analyze/report.html", f"/hetero/dags/{DAG}/history"]
    for path in paths:
        assert fetch(airflow, path).status == 401, path
        assert fetch(airflow, path, token="not.a.token").status == 403, path
        browser = fetch(airflow, path, Accept="text/html")
        assert browser.status == 303, path
        login = urllib.parse.urlsplit(browser.headers["location"])
        assert login.path == "/auth/login" and urllib.parse.parse_qs(login.query)["next"] == [
            f"http://127.0.0.1:{airflow.port}{urllib.parse.unquote(path)}"], browser.headers
    report = fetch(airflow, paths[0], Cookie=f"_token={airflow.api.token}")  # how the UI's tab asks
    assert report.status == 200 and report.body == (finished.folder / "analyze" / "report.html").read_bytes()


def test_a_finished_runs_report_and_files_are_served_read_only(airflow, finished):
    """The analyze task's "Report" link is the run's report page; the train task's events link its
    folder there; files come with a sandboxing Content-Security-Policy, folders as listings."""
    token = airflow.api.token
    links = airflow.api.get(f"/dags/{DAG}/dagRuns/{quote(finished.run_id)}/taskInstances/analyze/links")["extra_links"]
    base = f"http://127.0.0.1:{airflow.port}"
    assert links["Report"] == f"{base}{finished.pages}/report", links
    report = fetch(airflow, urllib.parse.urlsplit(links["Report"]).path, token)
    assert report.status == 200 and report.headers["content-type"].startswith("text/html")
    assert report.body == (finished.folder / "analyze" / "report.html").read_bytes()
    assert report.text.count("<img") >= 3  # the plots, inline
    assert report.headers["content-security-policy"].startswith("sandbox") and "allow-same-origin" not in report.headers[
        "content-security-policy"]
    assert report.headers["x-content-type-options"] == "nosniff"
    events = airflow.api.get(f"/dags/{DAG}/dagRuns/{quote(finished.run_id)}/taskInstances/train/links")["extra_links"]
    assert events["TensorBoard events"] == f"{base}{finished.pages}/files/train/events/", events
    listing = fetch(airflow, f"{finished.pages}/files/train/events/", token)
    names = [p.name for p in (finished.folder / "train" / "events").iterdir()]
    assert listing.status == 200 and names and all(name in listing.text for name in names), listing.text[:2000]
    metrics = fetch(airflow, f"{finished.pages}/files/analyze/metrics.json", token)
    assert metrics.headers["content-type"] == "application/json"
    assert json.loads(metrics.body) == json.loads((finished.folder / "analyze" / "metrics.json").read_text())
    top = fetch(airflow, f"{finished.pages}/files/", token)
    assert top.status == 200 and all(f'href="{stage}/"' in top.text for stage in ("preload", "train", "analyze"))
    assert "script" not in top.headers["content-security-policy"]
    folder = fetch(airflow, f"{finished.pages}/files/analyze", token)  # relative links need the "/"
    assert (folder.status, folder.headers["location"]) == (307, "analyze/")
    for method in ("POST", "PUT", "DELETE"):
        assert fetch(airflow, f"{finished.pages}/files/analyze/report.html", token, method).status == 405
    NOTES.append(f"the report page: {len(report.body) / 1e6:.1f} MB")


def test_paths_out_of_the_run_and_other_dags_runs_are_refused(airflow, finished, tmp_path):
    token = airflow.api.token
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET beside the artifact root")
    other = RunDir.for_run(str(finished.artifacts), DAG, "another_run").root  # a run folder beside this one
    (other / "analyze").mkdir(parents=True)
    (other / "analyze" / "report.html").write_text("ANOTHER run's report")
    analyze = finished.folder / "analyze"
    (analyze / "secret.txt").symlink_to(secret)
    (analyze / "theirs.html").symlink_to(other / "analyze" / "report.html")
    (analyze / "same.html").symlink_to(analyze / "report.html")  # a link inside the run: followed
    files = f"{finished.pages}/files"
    assert fetch(airflow, f"{files}/analyze/same.html", token).body == (analyze / "report.html").read_bytes()
    refused = {
        "symbolic link out": f"{files}/analyze/secret.txt",
        "symbolic link to another run": f"{files}/analyze/theirs.html",
        "dot segments": f"{files}/../another_run/analyze/report.html",
        "encoded dots": f"{files}/%2e%2e/another_run/analyze/report.html",
        "encoded dots and slashes": f"{files}/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
        "absolute path": f"{files}//etc/passwd",
        "encoded absolute path": f"{files}/%2Fetc%2Fpasswd",
        "backslashes": f"{files}/..%5c..%5canother_run%5canalyze%5creport.html",
    }
    for what, path in refused.items():
        answer = fetch(airflow, path, token)
        assert answer.status == 403, (what, answer)
        assert b"SECRET" not in answer.body and b"ANOTHER" not in answer.body and b"root:" not in answer.body
    page = fetch(airflow, refused["dot segments"], token, Accept="text/html")
    assert page.status == 403 and "Refused" in page.text and "only paths inside the run" in page.text
    not_found = {
        "another DAG": f"/hetero/dags/profile_pool/runs/{quote(finished.run_id)}/report",
        "another DAG's files": f"/hetero/dags/profile_pool/runs/{quote(finished.run_id)}/files/analyze/report.html",
        "a run id of dots": f"/hetero/dags/{DAG}/runs/%2e%2e/files/another_run/analyze/report.html",
        "a run folder's name, not a run": f"/hetero/dags/{DAG}/runs/another_run/report",
        "double-encoded dots (a name)": f"{files}/%252e%252e/another_run/analyze/report.html",
        "a missing file": f"{files}/analyze/nothing.html",
    }
    for what, path in not_found.items():
        answer = fetch(airflow, path, token)
        assert answer.status == 404, (what, answer)
        assert b"ANOTHER" not in answer.body
    assert "has no run" in fetch(airflow, not_found["another DAG"], token).text


def test_the_history_page_of_the_dag(airflow, finished, deployment_defaults):
    """``<artifact_root>/<dag_id>/history.html``: of the deployment's artifact root, or with
    ``?run_id=`` of that run's; a clear 404 while there is none."""
    token = airflow.api.token
    default = deployment_defaults.artifacts / DAG / "history.html"
    answer = fetch(airflow, f"/hetero/dags/{DAG}/history", token)
    assert answer.status == (200 if default.is_file() else 404), answer
    mine = finished.artifacts / DAG / "history.html"
    path = f"/hetero/dags/{DAG}/history?run_id={quote(finished.run_id)}"
    if not mine.exists():  # the analyze task writes none (yet): say so, then serve one put there
        absent = fetch(airflow, path, token)
        assert absent.status == 404 and "No history page for train_pipeline yet" in absent.text, absent
        mine.write_text("<!doctype html><title>history</title><h1>Runs of train_pipeline</h1>")
    answer = fetch(airflow, path, token)
    assert answer.status == 200 and answer.body == mine.read_bytes()
    assert answer.headers["content-security-policy"].startswith("sandbox")
    assert fetch(airflow, "/hetero/dags/no_such_dag/history", token).status == 404


def test_the_airflow_ui_shows_the_report_and_history_tabs(airflow, finished, deployment_defaults, tmp_path):
    """Chromium through the real UI: log in, open the finished run, its Report tab shows the
    report's plots; the DAG's History tab; a path out of the run is refused in the browser too."""
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} (Debian's chromium package, scripts/setup-chromium.sh) for the browser test")
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{airflow.port}"
    run_page = f"{base}/dags/{DAG}/runs/{quote(finished.run_id)}"
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                                       headless=True, viewport={"width": 1400, "height": 1000})
        try:
            page = browser.new_page()
            page.goto(f"{base}/auth/login?next={urllib.parse.quote(run_page)}")
            page.fill("input[name=username]", USER)
            page.fill("input[name=password]", PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{run_page}**")
            page.get_by_text("Report", exact=True).first.click()  # the run's tab
            page.wait_for_url("**/plugin/hetero-report")
            report = page.frame_locator("iframe").first
            report.locator("img").nth(2).wait_for()  # times out (fails) unless three plots at least show
            assert "Training report" in report.locator("h1").inner_text()
            page.screenshot(path=tmp_path / "report.png")
            page.goto(f"{run_page}/tasks/analyze")
            page.get_by_text("Report", exact=True).first.click()  # the task instance's tab
            page.wait_for_url("**/tasks/analyze/plugin/hetero-task-report")
            task_report = page.frame_locator("iframe").first
            task_report.locator("img").nth(2).wait_for()
            page.goto(f"{base}/dags/{DAG}")
            page.get_by_text("History", exact=True).first.click()  # the DAG's tab
            page.wait_for_url("**/plugin/hetero-history")
            heading = page.frame_locator("iframe").first.locator("h1, h2").first
            expected = "Run history" if (deployment_defaults.artifacts / DAG / "history.html").is_file() else "Not found"
            assert expected in heading.inner_text(), heading.inner_text()
            page.screenshot(path=tmp_path / "history.png")
            # a browser removes "..", "%2e%2e" too, before sending: an encoded "/" stays
            refused = page.goto(f"{base}{finished.pages}/files/..%2f..%2f..%2fetc%2fpasswd")
            assert refused.status == 403 and "Refused" in page.inner_text("body")
        finally:
            browser.close()
    shutil.rmtree(profile, ignore_errors=True)
    NOTES.append(f"browser screenshots: {tmp_path}")
