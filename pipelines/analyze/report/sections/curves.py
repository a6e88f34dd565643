"""The training curves (loss, accuracy) and the learning rate against step, from the event files."""

from __future__ import annotations

from pipelines.analyze.report import figures
from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.markup import missing
from pipelines.analyze.report.registry import section


@section("Training curves", place=20)
def curves(r: ReportInputs) -> str:
    scalars = r.scalars
    panels = [
        (t, label) for t, label in (("train/loss", "loss"), ("train/accuracy", "accuracy")) if scalars.get(t)
    ]
    if not panels:
        return missing("No train/loss or train/accuracy scalars in the event files.")
    fig, axes = figures.new_figure(len(panels))
    for ax, (tag, label) in zip(axes, panels, strict=True):
        ax.plot(*figures.xy(scalars[tag]), marker=".", color="C0" if label == "loss" else "C2")
        ax.set(title=f"Training {label}", xlabel="step", ylabel=label)
        ax.grid(alpha=0.3)
    return figures.img(fig, "training loss and accuracy")


@section("Learning-rate schedule", place=30)
def lr_schedule(r: ReportInputs) -> str:
    points = r.scalars.get("train/learning_rate")
    if not points:
        return missing("No train/learning_rate scalars in the event files.")
    fig, (ax,) = figures.new_figure()
    ax.plot(*figures.xy(points), color="C1")
    ax.set(title="Learning rate (warm-up, then schedule)", xlabel="step", ylabel="learning rate")
    ax.grid(alpha=0.3)
    return figures.img(fig, "learning rate schedule")
