"""Notifications: a failed task or run and a promoted model version, sent through Airflow's
notifier classes (docs/ARCHITECTURE.md, "Model versions and promotion"; how to set them up:
docs/guide/retraining.md, "Notifications").

The deployment names its notifiers in Airflow's own configuration, section ``[hetero]``::

    [hetero]
    notify_on_failure = [{"class": "smtp", "kwargs": {"to": "ml-ops@example.com"}}]
    notify_on_promotion = [{"class": "smtp", "kwargs": {"to": "ml-team@example.com"}},
                           {"class": "mycompany.alerts:ChatNotifier", "kwargs": {"channel": "#models"}}]

or ``AIRFLOW__HETERO__NOTIFY_ON_FAILURE`` / ``AIRFLOW__HETERO__NOTIFY_ON_PROMOTION``.  Each is a
JSON list of ``{"class": ..., "kwargs": {...}}``: ``class`` is ``"package.module:Class"``,
``"package.module.Class"`` or ``"smtp"`` (the SMTP provider's ``SmtpNotifier``, whose server and
credentials are the Airflow connection ``smtp_default``, or its ``smtp_conn_id``), a subclass of
``airflow.sdk.BaseNotifier``; ``kwargs`` go to its constructor.  Every component reads the value
while it parses the DAG files, without a database.  A bad value (not JSON, a class that does not
import, kwargs its constructor refuses) is an import error of the DAG that names the setting.

Each notice builds fresh notifiers from the setting (a notifier renders its templates in place, so
one instance serves one notice) and puts what happened in the context as ``notification``: the
SMTP notifier gets a subject and an HTML body from it unless the setting gives its own; any
notifier's templates may use ``{{ notification.text }}``, ``{{ notification.subject }}`` or its
fields (:func:`failure_facts`, :func:`promotion_facts`).  A notifier that fails is logged and the
others still run; nothing here fails or retries a task.
"""

from __future__ import annotations

import html
import importlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseNotifier
from airflow.sdk.configuration import conf
from markupsafe import Markup

from hetero.links import file_url
from hetero.web.urls import base_url, report_url, web_links_enabled

__all__ = ["FailureNotifier", "NotificationSettingError", "NotifierSetting", "PromotionNotifier", "error_line",
           "promotion_notice", "read_setting", "run_failure_notice", "task_failure_notice"]

SECTION = "hetero"
FAILURE, PROMOTION = "notify_on_failure", "notify_on_promotion"
ALIASES = {"smtp": "airflow.providers.smtp.notifications.smtp.SmtpNotifier"}
SMTP_NOTIFIER = ALIASES["smtp"]

log = logging.getLogger(__name__)


class NotificationSettingError(ValueError):
    """A notification setting that cannot be used; the message names the setting."""


def where(key: str) -> str:
    """How errors name a setting: ``[hetero] notify_on_failure (AIRFLOW__HETERO__NOTIFY_ON_FAILURE)``."""
    return f"[{SECTION}] {key} (AIRFLOW__{SECTION.upper()}__{key.upper()})"


@dataclass(frozen=True)
class NotifierSetting:
    """One entry of a setting: the notifier class and its constructor's keyword arguments."""

    name: str  # how errors and logs name it: the setting and the entry's number
    cls: type
    kwargs: dict

    def build(self, facts: dict | None = None) -> BaseNotifier:
        """A new notifier; the SMTP notifier gets this notice's subject and body unless the
        setting gives its own (a ``subject`` or ``html_content``/``template`` key, even null)."""
        kwargs = dict(self.kwargs)
        if facts is not None and is_smtp(self.cls):
            kwargs.setdefault("subject", "{{ notification.subject }}")
            if "template" not in kwargs:
                kwargs.setdefault("html_content", "{{ notification.html }}")
        return self.cls(**kwargs)


def is_smtp(cls: type) -> bool:
    """Whether ``cls`` is the SMTP provider's notifier or a subclass (by name: the provider is only
    imported where a setting names it)."""
    return any(f"{k.__module__}.{k.__qualname__}" == SMTP_NOTIFIER for k in cls.__mro__)


def read_setting(key: str, value: str | None = None) -> tuple[NotifierSetting, ...]:
    """The notifiers of ``[hetero] <key>`` (``value`` instead of the configuration, for tests):
    each class imported and built once with its kwargs, so a mistake is found when the DAG is
    parsed rather than when the first notice is due; a :class:`NotificationSettingError` names the
    setting and the entry.  Empty or unset: no notifiers."""
    raw = conf.get(SECTION, key, fallback="") if value is None else value
    if not (raw or "").strip():
        return ()
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise NotificationSettingError(f"{where(key)}: not JSON ({e}): {raw!r}") from None
    entries = [doc] if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        raise NotificationSettingError(f'{where(key)}: expected a JSON list of {{"class": ..., "kwargs": {{...}}}}, '
                                       f"got {type(doc).__name__}")
    return tuple(_entry(f"{where(key)}, entry {i}", entry) for i, entry in enumerate(entries, 1))


def _entry(name: str, entry: Any) -> NotifierSetting:
    if not isinstance(entry, dict) or not isinstance(entry.get("class"), str) or not entry["class"].strip():
        raise NotificationSettingError(f'{name}: expected {{"class": "package.module:Class", "kwargs": {{...}}}}, '
                                       f"got {entry!r}")
    unknown = sorted(set(entry) - {"class", "kwargs"})
    if unknown:
        raise NotificationSettingError(f"{name}: unknown key(s) {', '.join(map(repr, unknown))} (allowed: 'class', 'kwargs')")
    kwargs = entry.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise NotificationSettingError(f"{name}: 'kwargs' must be a JSON object, got {kwargs!r}")
    cls = import_class(name, entry["class"].strip())
    setting = NotifierSetting(name, cls, kwargs)
    try:
        setting.build()
    except Exception as e:
        raise NotificationSettingError(f"{name}: {cls.__qualname__}(**{json.dumps(kwargs)}) failed: "
                                       f"{type(e).__name__}: {e}") from None
    return setting


def import_class(name: str, path: str) -> type:
    """The class ``path`` names (``package.module:Class``, ``package.module.Class`` or an alias),
    which must be a notifier."""
    dotted = ALIASES.get(path.lower(), path)
    module, sep, attr = dotted.partition(":") if ":" in dotted else dotted.rpartition(".")
    if not module or not attr:
        raise NotificationSettingError(f"{name}: class {path!r} is not 'package.module:Class' or 'package.module.Class'")
    try:
        found = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except Exception as e:  # ImportError, AttributeError, or the module's own error
        raise NotificationSettingError(f"{name}: class {path!r} cannot be imported ({type(e).__name__}: {e})") from None
    if not (isinstance(found, type) and issubclass(found, BaseNotifier)):
        raise NotificationSettingError(f"{name}: {path!r} is not a notifier class (a subclass of "
                                       "airflow.sdk.BaseNotifier)")
    return found


def error_line(error: BaseException | str | None) -> str:
    """The line of an error that says what went wrong: a stage's last ``ERROR:`` line, else the
    message's last line (a task's error ends with the stage's own lines, see
    :mod:`hetero.runners.local_runner`)."""
    if error is None:
        return "no error was recorded: the task was stopped from outside or stopped heartbeating"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[-1]
    last = lines[-1] if lines else ""
    return f"{type(error).__name__}: {last}" if isinstance(error, BaseException) else last


def _ti_fields(context: dict) -> dict:
    ti = context.get("ti") or context.get("task_instance")
    dag_run = context.get("dag_run")
    dag = context.get("dag")
    fields = {
        "dag_id": getattr(ti, "dag_id", None) or getattr(dag, "dag_id", None),
        "run_id": getattr(ti, "run_id", None) or context.get("run_id") or getattr(dag_run, "run_id", None),
        "task_id": getattr(ti, "task_id", None),
        "map_index": getattr(ti, "map_index", -1),
        "try_number": getattr(ti, "try_number", None),
        "log_url": None,
    }
    if ti is not None:
        try:
            fields["log_url"] = ti.log_url  # Airflow's task-instance page, from [api] base_url
        except Exception:  # a context without a full task instance: no link rather than no notice
            log.debug("no log URL for %s", ti, exc_info=True)
    return fields


def failure_facts(context: dict, *, run_level: bool = False) -> dict | None:
    """What a failure notice says: ``event`` ("failure"), ``dag_id``, ``run_id``, ``task_id``,
    ``try_number``, ``error`` (:func:`error_line`), ``log_url``, ``reason``,
    ``subject``, ``text``, ``html``.  ``run_level`` for the DAG's callback: None when the run
    failed because a task failed, since that task's own callback has sent the notice."""
    reason = context.get("reason")
    if run_level and reason == "task_failure":
        return None
    facts = {"event": "failure", **_ti_fields(context), "reason": reason}
    dag_id, run_id, task_id = facts["dag_id"], facts["run_id"], facts["task_id"]
    if run_level:
        facts["error"] = f"the run failed: {reason}"
        if not facts["log_url"]:
            facts["log_url"] = f"{base_url() or 'http://localhost:8080'}/dags/{dag_id}/runs/{run_id}"
        facts["subject"] = f"[Airflow] {dag_id}: run {run_id} failed ({reason})"
        head = f"Run {run_id} of DAG {dag_id} failed: {reason}" + (f" (last task: {task_id})." if task_id else ".")
    else:
        facts["error"] = error_line(context.get("exception"))
        index, task = facts["map_index"], task_id
        if isinstance(index, int) and index >= 0:  # a mapped task, by its rendered name (profile_pool's device type)
            task = f"{task_id}[{getattr(context.get('ti'), 'rendered_map_index', None) or index}]"
        facts["subject"] = f"[Airflow] {dag_id}: task {task} failed (try {facts['try_number']})"
        head = f"Task {task} of DAG {dag_id} failed in run {run_id}, try {facts['try_number']}."
    lines = [("", head), ("Error", facts["error"]), ("Log", facts["log_url"])]
    return {**facts, **_bodies(lines)}


def promotion_facts(context: dict, *, analyze_task_id: str = "analyze") -> dict | None:
    """What a promotion notice says, from the promote task's result (its XCom): ``event``
    ("promotion"), ``model``, ``version``, ``previous``, ``mode``, ``reason``, ``dag_id``,
    ``run_id``, ``task_id``, ``report_url``, ``log_url``, ``subject``, ``text``, ``html``.  None
    when the task promoted nothing."""
    ti = context.get("ti")
    result = ti.xcom_pull(task_ids=ti.task_id) if ti is not None else None
    if not isinstance(result, dict) or not result.get("promoted"):
        log.info("no promotion notice: %s", (result or {}).get("reason", "the task returned no promotion result"))
        return None
    facts = {"event": "promotion", **_ti_fields(context)}
    facts.update({k: result.get(k) for k in ("model", "version", "previous", "mode", "reason")})
    facts["report_url"] = _report_link(context, facts["dag_id"], facts["run_id"], analyze_task_id)
    was = f"replacing {facts['previous']}" if facts["previous"] else "the first promoted version"
    facts["subject"] = f"[Airflow] {facts['dag_id']}: {facts['model']} {facts['version']} promoted"
    head = (f"{facts['model']} {facts['version']} is the promoted version ({was}), by run {facts['run_id']} "
            f"of DAG {facts['dag_id']} (promotion.mode {facts['mode']}).")
    lines = [("", head), ("Why", facts["reason"]), ("Report", facts["report_url"]), ("Log", facts["log_url"])]
    return {**facts, **_bodies(lines)}


def _report_link(context: dict, dag_id: str, run_id: str, analyze_task_id: str) -> str | None:
    """The run's report: its page inside Airflow (:mod:`hetero.web`), else the analyze task's
    report file as :func:`hetero.links.file_url` links it."""
    if web_links_enabled():
        return report_url(dag_id, run_id)
    try:
        analyze = context["ti"].xcom_pull(task_ids=analyze_task_id) or {}
    except Exception:
        log.warning("no report link: the %s task's result could not be read", analyze_task_id, exc_info=True)
        return None
    root = (context.get("params") or {}).get("artifact_root")
    return file_url(analyze["report"], root) if analyze.get("report") else None


def _bodies(lines: list[tuple[str, str | None]]) -> dict:
    """The notice as plain text and as HTML (values escaped, links clickable)."""
    lines = [(label, value) for label, value in lines if value]
    text = "\n".join(f"{label}: {value}" if label else value for label, value in lines)
    parts = []
    for label, value in lines:
        shown = html.escape(value)
        if value.startswith(("http://", "https://", "file://")):
            shown = f'<a href="{html.escape(value, quote=True)}">{shown}</a>'
        parts.append(f"<p><b>{html.escape(label)}:</b> {shown}</p>" if label else f"<p>{shown}</p>")
    return {"text": text, "html": Markup("\n".join(parts))}  # Markup: not escaped again by an autoescaping DAG


def _notice_context(context: dict, facts: dict) -> dict:
    """The context a notifier renders with: the callback's, plus ``notification``.  Without a DAG
    that has a template environment (``dag.test()`` gives the DAG's callbacks the serialized DAG),
    the notifier renders in its own default environment."""
    out = {**context, "notification": facts}
    if not callable(getattr(out.get("dag"), "get_template_env", None)):
        out.pop("dag", None)
    return out


class _Notice(BaseNotifier):
    """Sends one kind of notice through every notifier of a setting; a callback Airflow calls with
    the task's (or the run's) context."""

    def __init__(self, settings: tuple[NotifierSetting, ...]):
        super().__init__()
        self.settings = settings

    def facts(self, context: dict) -> dict | None:
        raise NotImplementedError

    def render_template_fields(self, context, jinja_env=None) -> None:
        """Nothing of its own to render (the notifiers it builds render theirs)."""

    def notify(self, context: dict) -> None:
        try:
            facts = self.facts(context)
        except Exception:  # a notice must never change how the task ends
            log.exception("notification: could not describe what happened; nothing sent")
            return
        if facts is None:
            return
        for setting in self.settings:
            try:  # a copy each: a notifier adds its template fields to the context it renders with
                setting.build(facts)(_notice_context(context, facts))
                log.info("notification sent: %s through %s", facts["subject"], setting.name)
            except Exception:
                log.exception("notification %r not sent through %s", facts["subject"], setting.name)


class FailureNotifier(_Notice):
    """A failed task (a task's ``on_failure_callback``) or, with ``run_level``, a run that failed
    for another reason than a failed task (the DAG's ``on_failure_callback``)."""

    def __init__(self, settings: tuple[NotifierSetting, ...], *, run_level: bool = False):
        super().__init__(settings)
        self.run_level = run_level

    def facts(self, context: dict) -> dict | None:
        return failure_facts(context, run_level=self.run_level)


class PromotionNotifier(_Notice):
    """The promote task's ``on_success_callback``: a notice when it promoted a version."""

    def __init__(self, settings: tuple[NotifierSetting, ...], *, analyze_task_id: str = "analyze"):
        super().__init__(settings)
        self.analyze_task_id = analyze_task_id

    def facts(self, context: dict) -> dict | None:
        return promotion_facts(context, analyze_task_id=self.analyze_task_id)


def task_failure_notice() -> FailureNotifier | None:
    """The tasks' ``on_failure_callback`` (``default_args``): None without ``notify_on_failure``."""
    settings = read_setting(FAILURE)
    return FailureNotifier(settings) if settings else None


def run_failure_notice() -> FailureNotifier | None:
    """The DAG's ``on_failure_callback``: a run that failed without a failed task (a timeout, a
    deadlock); None without ``notify_on_failure``."""
    settings = read_setting(FAILURE)
    return FailureNotifier(settings, run_level=True) if settings else None


def promotion_notice() -> PromotionNotifier | None:
    """The promote task's ``on_success_callback``: None without ``notify_on_promotion``."""
    settings = read_setting(PROMOTION)
    return PromotionNotifier(settings) if settings else None
