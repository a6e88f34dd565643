"""The held-out evaluation of the trained model, and the published version beside the promoted one."""

from __future__ import annotations

from pipelines.analyze.report import figures
from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.markup import Raw, esc, missing, num, pct, table
from pipelines.analyze.report.registry import section


@section("Held-out evaluation", place=100)
def _evaluation_section(r: ReportInputs) -> str:
    return _evaluation(r.evaluation, (r.preload or {}).get("class_counts"))


def _evaluation(evaluation: dict | None, class_counts: dict | None) -> str:
    if not evaluation or evaluation.get("accuracy") is None:
        return missing("No held-out evaluation (no held-out rows or no model).")
    per_class = evaluation.get("per_class_accuracy") or []
    confusion = evaluation.get("confusion") or []
    parts = [
        f"<p>Held-out accuracy: <b>{pct(evaluation['accuracy'])}</b> on {num(evaluation.get('rows'))} rows.</p>"
    ]
    rows = [
        (
            str(c),
            sum(confusion[c]) if c < len(confusion) else None,
            (class_counts or {}).get(str(c)),
            Raw(pct(acc)),
        )
        for c, acc in enumerate(per_class)
    ]
    parts.append(table(["Class", "Held-out rows", "Training rows", "Accuracy"], rows))
    if confusion:
        n = len(confusion)
        # room on the right for the colour bar, which takes its width from the panel, and its labels
        fig, (ax,) = figures.new_figure(width=max(3.5, 0.45 * n + 2), height=max(3.0, 0.45 * n + 1.5),
                                        margins=figures.MARGINS._replace(right=0.6))
        image = ax.imshow(confusion, cmap="Blues")
        fig.colorbar(image, ax=ax, fraction=0.046)
        if n <= 20:
            peak = max(max(r) for r in confusion) or 1
            for t in range(n):
                for p in range(n):
                    colour = "white" if confusion[t][p] > peak / 2 else "black"
                    ax.text(p, t, str(confusion[t][p]), ha="center", va="center", fontsize=8, color=colour)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set(title="Confusion matrix", xlabel="predicted class", ylabel="true class")
        parts.append(figures.img(fig, "confusion matrix"))
    return "".join(parts)


@section("Model versions", place=110)
def _versions(r: ReportInputs) -> str:
    """The published version beside the promoted one, evaluated on the same held-out rows."""
    comparison = r.comparison
    if not comparison:
        return missing("Nothing was published (no publish result), so there is no version to compare.")
    new, old = comparison["new"], comparison.get("promoted")
    columns = [("this run", new)] + ([("promoted", old)] if old else [])
    head = "".join(f"<th>{esc(label)}: {esc(entry['version'])}</th>" for label, entry in columns)
    rows = [("held-out accuracy", [num(e.get("accuracy")) for _, e in columns]),
            ("location", [esc(e.get("uri") or "") for _, e in columns])]
    if old:
        rows.append(("trained in run", [esc(new.get("run_id") or "this run"), esc(old.get("run_id") or "")]))
    classes = max(len(e.get("per_class_accuracy") or []) for _, e in columns)
    for k in range(classes):
        rows.append((f"class {k} accuracy", [num((e.get("per_class_accuracy") or [None] * classes)[k]) for _, e in columns]))
    body = "".join(f"<tr><td>{esc(name)}</td>{''.join(f'<td>{v}</td>' for v in values)}</tr>" for name, values in rows)
    verdict = "may replace it" if comparison["promotable"] else "may not replace it"
    return (f"<table><tr><th></th>{head}</tr>{body}</table>"
            f"<p>The new version {verdict}: {esc(comparison['reason'])}.</p>")
