"""Paired mode under pytest-xdist: each shard measures on a GPU and a core of its own."""

from __future__ import annotations

import pytest

from attnkit_perf.measure.processes import placement, shard_problem


def test_without_xdist_the_workers_keep_the_callers_gpu_on_the_last_core():
    assert placement(None, [0, 1, 2, 3], ["0", "1"]) == (3, None)


@pytest.mark.parametrize(("shard", "expected"), [(0, (7, "GPU-a")), (1, (6, "GPU-b")), (2, (5, "GPU-a"))])
def test_each_shard_takes_its_own_gpu_and_core(shard, expected):
    assert placement(shard, list(range(8)), ["GPU-a", "GPU-b"]) == expected


def test_one_core_is_left_unpinned():
    assert placement(1, [5], ["0", "1"]) == (None, "1")


def test_more_shards_than_gpus_is_refused_with_the_numbers():
    why = shard_problem(2, ["0"])
    assert why is not None
    for part in ("2 workers asked for (-n 2)", "1 GPU(s) visible (0)", "use -n 1 or fewer"):
        assert part in why, why


def test_as_many_shards_as_gpus_is_fine():
    assert shard_problem(2, ["0", "1"]) is None
