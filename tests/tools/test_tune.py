"""attnkit_tools.tune's choice among timed candidates (CPU only: no kernel runs)."""

from __future__ import annotations

from attnkit.triton.config import KernelConfig
from attnkit_tools.tune import _label, closest_to_best

SEQ_LENS = (1024, 4096, 16384)
SPRINTER = KernelConfig(128, 128, 8, 3)  # fastest at the longest length, poor at the shortest
STEADY = KernelConfig(64, 64, 4, 3)  # a little slower than the best at every length
SLOW = KernelConfig(32, 32, 4, 2)


def _timings(**times) -> dict:
    labels = {"sprinter": SPRINTER, "steady": STEADY, "slow": SLOW}
    return {_label(labels[name]): dict(zip(map(str, SEQ_LENS), t, strict=True)) for name, t in times.items()}


def test_the_config_closest_to_the_best_at_every_length_wins_over_the_fastest_at_one():
    timings = _timings(sprinter=(2.0, 1.0, 10.0), steady=(1.05, 1.05, 10.5), slow=(3.0, 3.0, 30.0))
    assert closest_to_best([SPRINTER, STEADY, SLOW], timings, SEQ_LENS) == STEADY


def test_a_config_best_everywhere_is_chosen_and_none_without_candidates():
    timings = _timings(sprinter=(0.9, 0.9, 9.0), steady=(1.0, 1.0, 10.0), slow=(3.0, 3.0, 30.0))
    assert closest_to_best([SLOW, STEADY, SPRINTER], timings, SEQ_LENS) == SPRINTER
    assert closest_to_best([], {}, SEQ_LENS) is None
