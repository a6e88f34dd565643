"""The weight distributions section (pipelines.analyze.report.sections.weights)."""

from __future__ import annotations

import pytest

from pipelines.analyze.report import figures as report_figures
from pipelines.analyze.report.sections import weights

pytestmark = pytest.mark.trainer


def test_weight_section_draws_the_first_variables_and_their_quantiles(monkeypatch):
    assert weights.quantiles([(0.0, 1.0, 1), (1.0, 2.0, 1), (2.0, 3.0, 2)], [0, 0.5, 1]) == [0.0, 2.0, 3.0]
    assert weights.quantiles([(5.0, 6.0, 0), (0.5, 0.5, 4)], [0, 0.25, 1]) == [0.5, 0.5, 0.5]  # a constant
    assert weights.quantiles([(0.0, 1.0, 0)], [0.5]) is None
    histograms = {
        f"weights/layer{i}/kernel": [(s, 0.0, [(-1.0 - s, 0.0, 5.0), (0.0, 1.0 + s, 5.0)]) for s in (0, 10, 20, 30, 40)]
        for i in range(10)
    }
    histograms["weights/layer0/bias"] = [(0, 0.0, [(0.0, 0.0, 4.0)])]
    histograms["other/activations"] = histograms["weights/layer1/kernel"]
    figures = []
    real_img = report_figures.img
    monkeypatch.setattr(report_figures, "img", lambda fig, alt: figures.append(fig) or real_img(fig, alt))
    html_text = weights.weight_distributions(histograms)
    (fig,) = figures
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0::2] == [f"layer{i}/kernel (10 values)" for i in range(8)]  # first 8 of 11, in order
    assert "first 8 of 11 weight variables" in html_text and "5 step(s), 0 to 40" in html_text
    steps = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert steps == ["step 0", "step 10", "step 30", "step 40"]  # four of five steps, ends included
    assert "<img" in weights.weight_distributions({"weights/layer0/bias": [(0, 0.0, [(0.0, 0.0, 4.0)])]})
    assert "No weight histograms" in weights.weight_distributions({"other/activations": histograms["other/activations"]})
    assert "No activation histograms" in html_text  # these weights came without activations


def test_activation_histograms_are_drawn_under_the_weights(monkeypatch):
    points = [(s, 0.0, [(-1.0, 0.0, 3.0), (0.0, 2.0 + s, 5.0)]) for s in (0, 20)]
    figures = []
    real_img = report_figures.img
    monkeypatch.setattr(report_figures, "img", lambda fig, alt: figures.append((alt, fig)) or real_img(fig, alt))
    html_text = weights.weight_distributions({"weights/dense/kernel": points, "activations/dense": points, "activations/logits": points})
    assert [alt for alt, _ in figures] == ["weight distributions over training", "activation distributions over training"]
    activations = figures[1][1]
    assert [ax.get_title() for ax in activations.axes][0::2] == ["dense (8 values)", "logits (8 values)"]
    assert activations.axes[0].get_ylabel() == "activation"
    assert "fixed batch of training rows" in html_text
