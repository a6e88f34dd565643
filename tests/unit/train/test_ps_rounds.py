"""Sync rounds (pipelines.train.ps_rounds): the cut chosen from the measured times of the cuts, the
rounds' chunks, and the chief's tally of each round: shares, speeds, a lost worker leaving the
count, the timings taken again."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.train import ps_rounds
from pipelines.train.ps_rounds import CUTS, STALE_ROUNDS, TRIES, Rounds, choose_cut, round_figures


def test_the_cuts_are_timed_in_order_and_the_fastest_is_kept():
    assert choose_cut({}) == 1
    assert choose_cut({1: [0.3]}) == (1 if TRIES > 1 else 2)
    timed = {1: [0.4, 0.3], 2: [0.2, 0.25]}
    assert choose_cut(timed) == 4  # 2 beat 1: the finer cut is timed too
    timed[4] = [0.22, 0.21]
    assert choose_cut(timed) == 2  # 4 lost to 2: 8 is not tried, 2 is kept
    assert choose_cut({1: [0.1, 0.1], 2: [0.2, 0.2]}) == 1  # equal workers: one chunk each
    assert choose_cut({k: [1.0 / k] * TRIES for k in CUTS}) == CUTS[-1]


def test_a_round_is_cut_into_k_chunks_per_worker_of_every_row_once():
    rounds = Rounds(2)
    rows = np.arange(100, 165)
    chunks = rounds.cut(rows)
    assert len(chunks) == 2  # the first round (it traces): one chunk each, not timed
    rounds.add(0, 33, 0.1)
    rounds.add(1, 32, 0.1)
    assert rounds.end(2, 1.0) == pytest.approx([33 / 65, 32 / 65]) and rounds.timed == {}
    for k in CUTS[:2]:
        for _ in range(TRIES):
            chunks = rounds.cut(rows)
            assert len(chunks) == 2 * k and sorted(np.concatenate(chunks).tolist()) == rows.tolist()
            assert {len(c) for c in chunks} <= {65 // (2 * k), 65 // (2 * k) + 1}
            rounds.add(0, 40, 0.1)
            rounds.add(1, 25, 0.1)
            rounds.end(len(chunks), 0.5 / k)  # the finer cut is faster
    assert rounds.timed == {1: [0.5 / 65] * TRIES, 2: [0.25 / 65] * TRIES}
    assert rounds.k == 2 and len(rounds.cut(rows)) == 8  # 2 beat 1: 4 chunks per worker timed next


def test_the_tally_measures_shares_and_speeds():
    rounds = Rounds(2)
    rounds.cut(np.arange(64))
    for worker, samples, seconds in [(0, 16, 0.05), (1, 16, 0.15), (0, 16, 0.05), (0, 16, 0.05)]:
        rounds.add(worker, samples, seconds)
    assert rounds.end(4, 0.2) == [0.75, 0.25]
    assert rounds.speed == pytest.approx([48 / 0.15, 16 / 0.15])
    assert rounds.shares(0) == {"round_share": 0.75, "round_share_min": 0.75, "round_share_max": 0.75,
                                "rows_per_s": 320.0}
    assert round_figures(rounds) == {"rounds": 1, "round_chunks_mean": 4.0, "round_cut": 1, "round_cut_s_per_row": {}}
    assert round_figures(None) == dict.fromkeys(["rounds", "round_chunks_mean", "round_cut", "round_cut_s_per_row"])


def test_a_worker_without_a_chunk_for_some_rounds_no_longer_counts():
    rounds = Rounds(2)
    for _ in range(STALE_ROUNDS):
        rounds.cut(np.arange(64))
        rounds.add(0, 64, 0.1)
        rounds.end(1, 0.11)
    assert rounds.live() == [0]
    assert len(rounds.cut(np.arange(64))) == rounds.k  # the one live worker's chunks only
    assert rounds.shares(1)["round_share"] == 0.0


def test_the_cuts_are_timed_again_after_a_while(monkeypatch):
    monkeypatch.setattr(ps_rounds, "RETIME_ROUNDS", 3)
    rounds = Rounds(1)
    for _ in range(4):
        rounds.cut(np.arange(8))
        rounds.add(0, 8, 0.1)
        rounds.end(1, 0.1)
    assert sum(len(t) for t in rounds.timed.values()) == 3
    rounds.cut(np.arange(8))
    assert rounds.timed == {} and rounds.k == 1  # timed afresh from the coarsest cut
