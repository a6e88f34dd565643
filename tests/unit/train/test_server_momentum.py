"""The servers' momentum (pipelines.train.ps_chief.server_momentum): 0.9 where the training is
synchronous or one worker trains alone; in async and bounded modes the spec's number, or by default
0.9 less the implicit momentum of N asynchronous workers, 1 - 1/N, never below zero."""

from __future__ import annotations

import pytest

from pipelines.spec import TrainingSpec
from pipelines.train.ps_chief import corrected_momentum, server_momentum


@pytest.mark.parametrize(("workers", "expected"), [(2, 0.4), (3, 0.233333), (4, 0.15), (5, 0.1), (10, 0.0), (64, 0.0)])
def test_auto_takes_off_the_momentum_asynchrony_adds(workers, expected):
    training = TrainingSpec(strategy="parameter_server", update_mode="async")
    assert training.async_momentum == "auto"
    assert server_momentum(training, workers) == pytest.approx(expected, abs=1e-6)
    assert corrected_momentum(workers) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("workers", [2, 3, 10])
def test_auto_keeps_horovods_momentum_in_bounded_mode(workers):
    """SSP's workers stay within s clocks, so their updates come nearly in rounds: a delay of about
    N - 1 changes, not the spread staleness that acts as momentum."""
    training = TrainingSpec(strategy="parameter_server", update_mode="bounded")
    assert server_momentum(training, workers) == 0.9


@pytest.mark.parametrize("mode", ["async", "bounded"])
def test_a_number_is_taken_as_it_is(mode):
    training = TrainingSpec(strategy="parameter_server", update_mode=mode, async_momentum=0.75)
    assert server_momentum(training, 3) == 0.75


@pytest.mark.parametrize(("mode", "workers"), [("sync", 3), ("async", 1), ("bounded", 1)])
def test_sync_and_one_worker_keep_horovods_momentum(mode, workers):
    training = TrainingSpec(strategy="parameter_server", update_mode=mode, async_momentum=0.3)
    assert server_momentum(training, workers) == 0.9


@pytest.mark.parametrize("bad", [1, 1.5, -0.1, "fast"])
def test_a_momentum_outside_0_1_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="async_momentum"):
        TrainingSpec(async_momentum=bad)


def test_the_default_combiner_weighs_a_late_gradient_down():
    assert TrainingSpec().combiner == "staleness_aware"
