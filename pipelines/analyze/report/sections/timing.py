"""The "Predicted vs actual run time" section: the estimate's prediction against the run, part by
part, with what the estimator learned from earlier runs."""

from __future__ import annotations

from pipelines.analyze.report import figures
from pipelines.analyze.report.inputs import HOROVOD_WORDS, ReportInputs, Words
from pipelines.analyze.report.markup import Raw, esc, missing, num, pct, table
from pipelines.analyze.report.registry import section


def _timing(train: dict, estimate: dict | None, metrics: dict, words: Words = HOROVOD_WORDS) -> str:
    plan = (estimate or {}).get("plan") or {}
    predicted, actual = plan.get("predicted_total_s"), train.get("train_seconds")
    if predicted is None or actual is None:
        why = (
            "no estimate result (the plan was given, not estimated)"
            if not estimate
            else "missing timing fields"
        )
        return missing(f"Cannot compare predicted and actual run time: {why}.")
    parts = [
        f"<p>Predicted {num(predicted)} s, actual {num(actual)} s; relative error "
        f"{pct(metrics.get('prediction_error'))} (positive: the estimate was too high).</p>"
    ]
    plan_ranks = {r.get("rank"): r for r in plan.get("ranks") or []}
    train_ranks = {r.get("rank"): r for r in train.get("ranks") or []}
    common = sorted(k for k in plan_ranks.keys() & train_ranks.keys() if k is not None)
    fig, axes = figures.new_figure(2 if common else 1, width=4.5)
    axes[0].bar([0, 1], [predicted, actual], color=["C0", "C1"])
    axes[0].set_xticks([0, 1], ["predicted", "actual"])
    axes[0].set(title="Training run time", ylabel="seconds")
    if common:
        width = 0.4
        axes[1].bar(
            [k - width / 2 for k in common],
            [plan_ranks[k].get("samples_per_sec") or 0 for k in common],
            width,
            label="predicted",
        )
        axes[1].bar(
            [k + width / 2 for k in common],
            [train_ranks[k].get("samples_per_sec") or 0 for k in common],
            width,
            label="measured",
        )
        axes[1].set_xticks(common)
        axes[1].set(title=f"Throughput per {words.unit}", xlabel=words.unit, ylabel="samples / s")
        axes[1].legend(fontsize=8)
    parts.append(figures.img(fig, "predicted vs actual run time"))
    return "".join(parts)


def _correction(part: str, fit: dict | None) -> str:
    """A part's learned correction as text: ``× factor + per_unit s per step (or per run)``."""
    if not fit:
        return ""
    terms = [f"× {num(fit['factor'], 3)}"] if part != "other" else []
    if fit.get("per_unit"):
        terms.append(f"+ {num(1e3 * fit['per_unit'], 3)} ms per step" if part == "steps" else f"+ {num(fit['per_unit'], 3)} s")
    return " ".join(terms)


def _timing_parts(estimate: dict | None, learned: dict | None) -> str:
    """The run time part by part (predicted, with the correction learned from earlier runs, and
    actual), where each device type's step time came from, and the errors of earlier runs of the
    same model on the same pool."""
    plan = (estimate or {}).get("plan") or {}
    timing, parts = plan.get("timing") or {}, (learned or {}).get("parts")
    if not timing:  # an estimate from before the part-by-part prediction
        return ""
    out = ["<h3>Part by part</h3>"]
    corrections = timing.get("corrections") or {}
    rows = []
    for name, predicted in timing["parts"].items():
        actual = (parts or {}).get(name, {}).get("actual")
        fit = (corrections.get("parts") or {}).get(name)
        rows.append((name, num(predicted), num(actual) if actual is not None else "not measured", _correction(name, fit)))
    out.append(table(["Part", "Predicted (s)", "Actual (s)", "Learned correction"], rows))
    if corrections.get("runs"):
        out.append(f"<p>Corrections learned from the latest {num(corrections['runs'])} run(s) on this pool.</p>")
    else:
        out.append("<p>No earlier run on this pool: the parts are the bank's prediction alone.</p>")
    if learned and not learned.get("recorded"):
        out.append(f"<p>This run was not added to the profile bank: {esc(str(learned.get('why_not')))}.</p>")
    profiles = (estimate or {}).get("profiles") or {}
    out.append(table(["Device type", "Step time from", "Fixed (ms)", "Per sample (µs)", "Max batch"],
                      [(name, str(p.get("source", "")), num(1e3 * p["fixed_s"]), num(1e6 * p["per_sample_s"]),
                        num(p.get("max_batch"))) for name, p in profiles.items()]))
    earlier = (learned or {}).get("earlier") or []
    if earlier:
        out.append("<h3>Earlier runs of this model on this pool</h3>")
        out.append(table(["Run", "Predicted (s)", "Actual (s)", "Error"],
                          [(r["run"], num(r["predicted_s"]), num(r["actual_s"]), Raw(pct(r["error"]))) for r in earlier]))
    return "".join(out)


@section("Predicted vs actual run time", place=80)
def _timing_section(r: ReportInputs) -> str:
    return _timing(r.train, r.estimate, r.metrics, r.words) + _timing_parts(r.estimate, r.learned)
