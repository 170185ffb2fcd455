"""pytest-xdist's ``load`` distribution, longest test first: the order in which a run's
correctness tests reach its workers when their seconds on this GPU model are recorded
(``baselines/<gpu_key>/test-durations.json``, :mod:`attnkit_perf.formats.durations`).

xdist hands out tests in the order they were collected, in chunks. A run's wall time is then
decided by when its longest test starts: in an H200 shard of a third of the nightly tests (pytest:
301 s), a flex hypothesis test of 240 s, collected late, ran to the end while five of the eight
workers had finished by 132 s. Started first, it overlaps the
rest: replaying xdist's rules over that shard's recorded times gives 251 s of tests instead of
277 s (the bound is the longest test, 241 s).

An xdist worker runs a test once it holds the next (pytest's teardown needs to know it), so each
worker is kept two tests deep, one test sent at a time: the longest pending one. The first two
rounds go out one test per worker, the second in reverse order, so no worker starts with the two
longest tests.
"""

from __future__ import annotations

from collections.abc import Callable

from xdist.scheduler import LoadScheduling


class LongestFirstScheduling(LoadScheduling):
    """xdist's load scheduling with the pending tests ordered by ``cost`` (a node id's expected
    seconds), longest first, ties in collection order, and sent one at a time."""

    def __init__(self, config, log, cost: Callable[[str], float]) -> None:
        super().__init__(config, log)
        self._cost = cost

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # a worker that joined later: fill it like the others
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = next(iter(self.node2collection.values()))
        order = sorted(range(len(self.collection)), key=lambda i: -self._cost(self.collection[i]))
        self.pending[:] = order
        for nodes in (self.nodes, self.nodes[::-1]):
            for node in nodes:
                if self.pending:
                    self._send_tests(node, 1)
        if not self.pending:
            for node in self.nodes:
                node.shutdown()

    def check_schedule(self, node, duration: float = 0) -> None:
        if node.shutting_down:
            return
        if not self.pending:
            node.shutdown()
        elif len(self.node2pending[node]) < 2:
            self._send_tests(node, 1)
