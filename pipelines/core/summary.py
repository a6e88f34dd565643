"""What a command of ``python -m pipelines`` prints for people: a few lines per stage or profile-bank
command (what was done, the key figures, where the full result is).

``python -m pipelines <command>`` prints :func:`summary_lines` by default and the result as one JSON
line with ``--json`` (what the Airflow tasks and pods ask for; docs/ARCHITECTURE.md, "Stages and
their contracts").  A stage's full result is also ``<run dir>/<stage>/result.json``.

Only the standard library: formatting a dict needs nothing more.  A result that lacks a figure
(an older result, a fixed learning rate) leaves out that line; one a formatter cannot read at all
falls back to :func:`generic_lines`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["summary_lines", "generic_lines", "duration", "SUMMARIES", "TEXT", "WIDTH"]

WIDTH = 160  # the longest line of the realistic results (paths aside: a path is never cut)
TEXT = 100  # free text (a reason, a value of the generic fallback) is cut to this with "..."
MAX_RANKS = 4  # ranks or device types listed one by one before "and N more"


def duration(seconds: float | None) -> str:
    """``0.85 s``, ``12.3 s``, ``4 min 05 s`` or ``2 h 03 min``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = float(seconds)
    if s < 10:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{float(value):,.{digits}f}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"


def _cut(text: Any, width: int = TEXT) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 3] + "..."


def _more(items: list[str], limit: int = MAX_RANKS) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", and {len(items) - limit} more" if len(items) > limit else "")


def _preload(r: Mapping[str, Any]) -> list[str]:
    shape = "x".join(str(d) for d in r.get("feature_shape") or []) or "?"
    lines = [f"preload: {_num(r['rows_train'])} training rows and {_num(r['rows_holdout'])} held-out rows, "
             f"{r.get('num_classes', '?')} classes, features {shape}"]
    cache = "from the cache" if r.get("cache_hit") else "converted"
    lines.append(f"shards: {len(r.get('train_shards') or [])} training and {len(r.get('holdout_shards') or [])} "
                 f"held-out, {cache} (content hash {str(r.get('content_hash', ''))[:12]})")
    if r.get("partitions"):
        lines.append(f"partitions: {_more([str(p) for p in r['partitions']])}")
    return lines


def _ranks_by_device(ranks: list[Mapping[str, Any]]) -> str:
    return _more([f"{x.get('device', '?')} batch {x.get('batch', '?')}" for x in ranks])


def _estimate(r: Mapping[str, Any]) -> list[str]:
    plan = r["plan"]
    ranks = plan.get("ranks") or []
    lines = [f"estimate: {plan.get('strategy') or 'horovod'} on {len(ranks)} ranks, global batch "
             f"{plan.get('global_batch')}: {_ranks_by_device(ranks)}"]
    deadline = "" if plan.get("meets_deadline", True) else "; misses the deadline"
    lines.append(f"predicted: {duration(plan.get('predicted_step_s'))} a step, {plan.get('steps_per_epoch')} steps "
                 f"an epoch, training {duration(plan.get('predicted_total_s'))}{deadline}")
    profiles = r.get("profiles") or {}
    calibrated = r.get("calibrated") or []
    banked = [name for name in profiles if name not in calibrated]
    parts = ([f"measured {', '.join(calibrated)}"] if calibrated else []) + (
        [f"from the profile bank {', '.join(banked)}"] if banked else [])
    if parts:
        lines.append(f"device profiles: {'; '.join(parts)}")
    if r.get("plan_path"):
        lines.append(f"plan: {r['plan_path']}")
    return lines


def _lr_search(r: Mapping[str, Any]) -> list[str]:
    lines = [f"lr_search: learning rate {float(r['learning_rate']):.4g} at global batch {r.get('global_batch', '?')} "
             f"({r.get('method', '?')})"]
    if r.get("lr_range"):
        lo, hi = r["lr_range"]
        lines.append(f"range test: {float(lo):.3g} to {float(hi):.3g} in {r.get('steps', '?')} steps, "
                     f"stopped: {r.get('stopped', '-')}")
    if r.get("reason"):
        lines.append(f"why: {_cut(r['reason'])}")
    return lines


def _train(r: Mapping[str, Any]) -> list[str]:
    lines = [f"train: {r.get('epochs', '?')} epochs, {_num(r.get('steps'))} steps in {duration(r['train_seconds'])} "
             f"({_num(r.get('samples_per_sec'))} samples/s), global batch {r.get('global_batch', '?')}"]
    acc = r.get("final_train_accuracy")
    lines.append(f"final loss {_num(r.get('final_loss'), 4)}"
                 + ("" if acc is None else f", training accuracy {float(acc):.4f}")
                 + f"; balance efficiency {_num(r.get('balance_efficiency'), 2)}"
                 + f", input wait {_pct(r.get('input_wait_fraction'))}")
    ranks = [f"{x.get('device', '?')} batch {x.get('batch', '?')} {_num(x.get('samples_per_sec'))}/s"
             for x in r.get("ranks") or []]
    if ranks:
        lines.append(f"ranks: {_more(ranks)}")
    if r.get("resumed_from_step"):
        lines.append(f"resumed from the checkpoint at step {r['resumed_from_step']}")
    if r.get("quota_enforced") is False:
        lines.append("CPU quotas not enforced (no writable cgroup): the ranks were only pinned")
    return lines


def _publish(r: Mapping[str, Any]) -> list[str]:
    return [f"publish: {r['model']} {r['version']} at {r.get('uri', '?')}", f"model store: {r.get('store', '?')}"]


def _analyze(r: Mapping[str, Any]) -> list[str]:
    lines = [f"analyze: held-out accuracy {float(r['holdout_accuracy']):.4f}"]
    if r.get("predicted_total_s") is not None and r.get("actual_train_s"):
        error = "" if r.get("prediction_error") is None else f" (error {100 * r['prediction_error']:+.1f}%)"
        lines.append(f"training time: predicted {duration(r['predicted_total_s'])}, actual "
                     f"{duration(r['actual_train_s'])}{error}")
    if r.get("balance_efficiency") is not None:
        lines.append(f"balance efficiency {float(r['balance_efficiency']):.2f}, "
                     f"{_num(r.get('samples_per_sec'))} samples/s")
    comparison = r.get("comparison") or {}
    if comparison:
        verdict = "promotable" if comparison.get("promotable") else "not promotable"
        lines.append(f"against the promoted version: {verdict} ({_cut(comparison.get('reason', '-'))})")
    if r.get("report"):
        lines.append(f"report: {r['report']}")
    return lines


def _promote(r: Mapping[str, Any]) -> list[str]:
    if r["promoted"]:
        was = f" (was {r['previous']})" if r.get("previous") else ""
        head = f"promote: {r.get('model', '?')} {r.get('version', '?')} is the promoted version{was}"
    else:
        head = f"promote: {r.get('model', '?')} {r.get('version', '?')} not promoted"
    return [head, f"why: {_cut(r.get('reason', '-'))} (promotion.mode {r.get('mode', '?')})"]


def _mlflow(m: Mapping[str, Any]) -> str:
    """The MLflow line of publish, analyze and promote with tracking.mlflow_uri (the result's ``mlflow``)."""
    parts = [f"mlflow: run {m.get('run_id', '?')}"]
    if m.get("model_version") is not None:
        parts.append(f"{m.get('registered_model', '?')} version {m['model_version']}")
    if m.get("alias"):
        parts.append(f"alias {m['alias']}")
    if m.get("metrics") is not None:
        parts.append(f"{m['metrics']} metrics and the report")
    return ", ".join(parts) + (f" ({m['url']})" if m.get("url") else "")


def _profile(r: Mapping[str, Any]) -> list[str]:
    lines = [f"profile: {r['rows']} step-time rows of {r.get('models', '?')} models on {r.get('device', '?')} "
             f"({r.get('size', '?')} sweep) in {duration(r.get('seconds'))}", f"profile bank: {r.get('bank', '?')}"]
    if r.get("quota_enforced") is False:
        lines.append("CPU quota not enforced (no writable cgroup): the sweep was only pinned")
    return lines


def _fit_bank(r: Mapping[str, Any]) -> list[str]:
    types = r["device_types"]
    lines = [f"fit-bank: {len(types)} device types in {r.get('bank', '?')}"]
    for name, fit in list(types.items())[:8]:
        memory = f", memory {fit['memory_model']}" if fit.get("memory_model") else ""
        lines.append(f"  {name}: {fit.get('rows')} rows of {fit.get('models')} models, step time "
                     f"{fit.get('step_model')} (cross-validated error {_pct(fit.get('step_cv_mape'))}){memory}")
    if len(types) > 8:
        lines.append(f"  and {len(types) - 8} more")
    return lines


def _probe(r: Mapping[str, Any]) -> list[str]:
    return [f"probe-allreduce: {r.get('ranks', '?')} ranks, latency {1e3 * float(r['latency_s']):.3f} ms, "
            f"bandwidth {float(r['bandwidth_bps']) / 1e6:,.1f} MB/s", f"profile bank: {r.get('bank', '?')}"]


def _reference_runs(r: Mapping[str, Any]) -> list[str]:
    lines = [f"reference-runs: {len(r['runs'])} runs in {duration(r.get('seconds'))}, recorded in {r.get('bank', '?')}"]
    for run in r["runs"]:
        error = "" if run.get("error") is None else f" (error {100 * run['error']:+.1f}%)"
        lines.append(f"  {run.get('model')}: predicted {duration(run.get('predicted_s'))}, actual "
                     f"{duration(run.get('actual_s'))}{error}" + ("" if run.get("recorded") else ", not recorded"))
    return lines


def _history(r: Mapping[str, Any]) -> list[str]:
    """A line per run, grouped by model and pool, oldest first; ``*`` marks the promoted version."""
    runs, skipped = r["runs"], r.get("skipped") or []
    page = f"page {r['page']}" if r.get("page") else "no page written (a filtered history needs --out)"
    lines = [f"history: {len(runs)} analysed runs of {r.get('dag_id', '?')}"
             + (f", {len(skipped)} skipped" if skipped else "") + f"; {page}"]
    width = max([len(str(x["run_id"])) for x in runs] + [6])
    by_group: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for x in runs:
        by_group.setdefault((x["model"], x["pool"]), []).append(x)
    for (model, pool), rows in sorted(by_group.items()):
        lines.append(f"{model} on {pool}:")
        lines.append(f"  {'run id':<{width}}  {'version':<8} {'accuracy':>8}  {'predicted/actual s':>18}  "
                     f"{'samples/s':>9}  {'balance':>7}  {'rate':>8}")
        for x in rows:
            version = (x.get("version") or "-") + (" *" if x.get("promoted") else "")
            acc = "-" if x.get("holdout_accuracy") is None else f"{x['holdout_accuracy']:.4f}"
            times = f"{_num(x.get('predicted_total_s'), 1)} / {_num(x.get('actual_train_s'), 1)}"
            rate = "-" if x.get("learning_rate") is None else f"{x['learning_rate']:.3g}"
            lines.append(f"  {x['run_id']:<{width}}  {version:<8} {acc:>8}  {times:>18}  "
                         f"{_num(x.get('samples_per_sec')):>9}  {_num(x.get('balance_efficiency'), 2):>7}  {rate:>8}")
    if any(x.get("promoted") for x in runs):
        lines.append("* the promoted version")
    lines += [f"skipped {s['run_id']}: {_cut(s['why'])}" for s in skipped]
    return lines


def _generate_data(r: Mapping[str, Any]) -> list[str]:
    return [f"generate-data: {_num(r['rows'])} rows in {len(r.get('files') or [])} files under {r['out']}"]


def _render(r: Mapping[str, Any]) -> list[str]:
    return [f"render: {r['count']} manifests in {r['out']}"]


SUMMARIES: dict[str, Callable[[Mapping[str, Any]], list[str]]] = {
    "preload": _preload, "estimate": _estimate, "lr_search": _lr_search, "train": _train,
    "publish": _publish, "analyze": _analyze, "promote": _promote,
    "profile": _profile, "fit-bank": _fit_bank, "probe-allreduce": _probe, "reference-runs": _reference_runs,
    "generate-data": _generate_data, "render": _render, "history": _history,
}  # fmt: skip


def generic_lines(command: str, result: Mapping[str, Any], limit: int = 8) -> list[str]:
    """Any result: its plain top-level values (numbers, strings, booleans), at most ``limit``."""
    plain = [(k, v) for k, v in result.items() if isinstance(v, (str, int, float, bool)) and k != "input_key"]
    lines = [f"{command}: done"] + [f"  {k}: {_cut(v)}" for k, v in plain[:limit]]
    if len(plain) > limit:
        lines.append(f"  and {len(plain) - limit} more values")
    return lines


def summary_lines(command: str, result: Mapping[str, Any]) -> list[str]:
    """The lines ``python -m pipelines <command>`` prints for people; the last says where the full
    result is (a stage's ``result.json``) and that ``--json`` prints it."""
    formatter = SUMMARIES.get(command)
    try:
        lines = formatter(result) if formatter else generic_lines(command, result)
    except (KeyError, TypeError, ValueError, AttributeError):
        lines = generic_lines(command, result)
    if isinstance(result.get("mlflow"), Mapping):
        lines.append(_mlflow(result["mlflow"]))
    if result.get("run_dir") and result.get("stage"):
        where = f"full result: {str(result['run_dir']).rstrip('/')}/{result['stage']}/result.json (--json prints it)"
    else:
        where = "full result: --json prints it as one JSON line"
    return [*lines, where]
