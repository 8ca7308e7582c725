"""Participants, dropouts and stragglers come from the seed: the same every time they are
drawn, independent device by device."""

from __future__ import annotations

import pytest

from mebp_core.federated.rounds import fate, is_straggler, participants


def test_participation_samples_the_fraction_again_each_round():
    rounds = [participants(10, 0.3, seed=4, round_index=r) for r in range(20)]
    assert all(len(chosen) == 3 and chosen == sorted(set(chosen)) for chosen in rounds)
    assert rounds == [participants(10, 0.3, seed=4, round_index=r) for r in range(20)]
    assert len({tuple(chosen) for chosen in rounds}) > 5
    assert participants(10, 0.01, seed=4, round_index=0) != []  # at least one device
    assert participants(3, 1.0, seed=4, round_index=9) == [0, 1, 2]
    with pytest.raises(ValueError, match="participation"):
        participants(3, 0.0, seed=4, round_index=0)


def test_dropouts_happen_at_their_rate_mid_round():
    fates = [fate(1, r, d, dropout=0.25, local_steps=5) for r in range(40) for d in range(10)]
    dropped = [f.offline_after_step for f in fates if f.offline_after_step is not None]
    assert 0.18 < len(dropped) / len(fates) < 0.32
    assert set(dropped) == {0, 1, 2, 3, 4}
    assert all(fate(1, r, d, 0.0, 5).offline_after_step is None
               for r in range(10) for d in range(10))
    assert fate(1, 3, 2, 0.25, 5) == fate(1, 3, 2, 0.25, 5)


def test_a_device_slower_than_the_deadline_is_a_straggler():
    assert is_straggler(12.0, 10.0) and not is_straggler(9.0, 10.0)
    assert not is_straggler(12.0, None) and not is_straggler(None, 10.0)
