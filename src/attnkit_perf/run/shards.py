"""Splitting the perf grid over N runners of one GPU model (``--attnkit-shard=I/N``): which rows
each runner measures. The verdicts of the N runners are merged back into one by
``python -m attnkit_perf.report merge`` (:mod:`attnkit_perf.decide.merge`).

The split is:

* **deterministic**: a function of the rows' names only, so every runner, collecting the same
  grid on its own, computes the same split;
* **balanced by expected cost**: a host-shape row (``-loop``: the host metric on more fresh
  processes; ``-graph``: a capture; ``-compiled``: a compile per process) costs
  :data:`HOST_ROW_COST` GPU rows (measured: ~27 s against ~7 s a row); a shard takes rows up to
  ``(1 + SLACK)`` times its fair share of the cost (a row that fits nowhere goes to the least
  loaded shard);
* **stable under adding a row**: consistent hashing with bounded loads. Rows are taken in the
  order of a hash of their name; each goes to the first shard of its own hashed preference order
  (rendezvous hashing) that still has room. A new row takes its own place in that order; the
  other rows keep their shards unless the room it takes (or the slightly larger bound) makes a
  later row spill over: a few rows move, not the whole grid.

The correctness tests of the same runners are split by :func:`balance`: each test costs the
seconds it took on this GPU model (``baselines/<gpu_key>/test-durations.json``,
:mod:`attnkit_perf.formats.durations`; a test not there the median of those that are, every test
1 when there is no file), the longest placed first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable

#: Expected cost of a host-shape row, in GPU rows.
HOST_ROW_COST = 4.0
#: How far above its fair share of the cost a shard may go before rows spill to the next choice.
SLACK = 0.10
_HOST_MARKERS = ("-loop", "-compiled", "-graph")


class ShardError(ValueError):
    """A ``--attnkit-shard`` value that names no shard."""


def parse_shard(text: str) -> tuple[int, int]:
    """``(index, count)`` of ``I/N`` (1 <= I <= N)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match:
        raise ShardError(f"--attnkit-shard={text}: expected I/N, e.g. 1/4 (shard 1 of 4)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"--attnkit-shard={text}: the index must be between 1 and N={count}, got {index}")
    return index, count


def row_cost(name: str) -> float:
    """A row's expected measuring cost, in GPU rows."""
    return HOST_ROW_COST if any(marker in name for marker in _HOST_MARKERS) else 1.0


def _hash(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\0".join(map(str, parts)).encode()).digest()[:8], "big")


def assign(names: Iterable[str], count: int) -> dict[str, int]:
    """Each row's shard, 1-based, for ``count`` shards (see the module's docstring)."""
    names = sorted(set(names), key=lambda n: (_hash(n), n))
    total = sum(row_cost(n) for n in names)
    capacity = (1.0 + SLACK) * total / count
    load = [0.0] * count
    shard = {}
    for name in names:
        cost = row_cost(name)
        preference = sorted(range(count), key=lambda s: _hash(name, s), reverse=True)
        fits = [s for s in preference if load[s] + cost <= capacity]
        chosen = fits[0] if fits else min(preference, key=lambda s: load[s])
        load[chosen] += cost
        shard[name] = chosen + 1
    return shard


def balance(names: Iterable[str], count: int, cost: Callable[[str], float]) -> dict[str, int]:
    """Each test's shard, 1-based, for ``count`` shards: the longest first, each to the least
    loaded shard (ties by name hash, so every runner computes the same split). Unlike
    :func:`assign` this does not keep a test's shard when others are added; the correctness tests
    need no such stability, and their costs span 0.1 to 225 s, so a 10% slack would leave one shard
    with a minute more than the other."""
    load = [0.0] * count
    shard = {}
    for name in sorted(set(names), key=lambda n: (-cost(n), _hash(n), n)):
        chosen = min(range(count), key=lambda s: (load[s], s))
        load[chosen] += cost(name)
        shard[name] = chosen + 1
    return shard


def grid_digest(names: Iterable[str]) -> str:
    """What every shard of one split must agree on: a digest of the rows split."""
    return hashlib.sha256("\n".join(sorted(set(names))).encode()).hexdigest()[:16]
