"""The performance history: every recorded run of the perf suite per GPU model, and a static
dashboard of it (docs/HISTORY.md).

    python -m attnkit_perf.history record --results run.json --store STORE
    python -m attnkit_perf.history publish --store STORE --out site/
    python -m attnkit_perf.history regressions --store STORE

``record`` turns one pytest-benchmark JSON of the perf suite into one schema-validated file of
the store (:mod:`.record`); ``publish`` reads the store (:mod:`.store`), finds steps and drifts
with asv's step detection (:mod:`.detect`) and writes the site with plotly charts (:mod:`.site`,
:mod:`.charts`). :func:`history_link` gives a verdict's base point on that site.
"""

from attnkit_perf.history.links import history_link
from attnkit_perf.history.record import HistoryError, record

__all__ = ["HistoryError", "history_link", "record"]
