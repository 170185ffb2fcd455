"""The hypothesis settings profiles of attnkit's test suites, chosen with ``HYPOTHESIS_PROFILE``:

* ``ci``       — derandomised, few examples, no deadline, no shrinking: the same examples every
                 run and bounded time on a 2-core CPU or a GPU runner, where shrinking a failure
                 through per-shape kernel compilation can take many minutes; the failing example
                 is still printed in full (the default under CI=true).
* ``dev``      — the default locally: random, a moderate number of examples. A failing example
                 is saved in hypothesis' database and replayed first on every later run until it
                 passes; replay a whole run with ``--hypothesis-seed=<n>``.
* ``thorough`` — many examples, for a GPU box or a nightly run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import ExampleDatabase

# filter_too_much: a backend that declines most drawn problems (sdpa-cudnn: no fp32, few odd
# head dims) makes tests reject() them by design; on the H100 it tripped the health check.
# function_scoped_fixture: the suite's tests take the backend and device, the same for every example.
_SUPPRESSED = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.function_scoped_fixture,
]
_NO_SHRINK = [Phase.explicit, Phase.generate, Phase.target]


def load_profiles(database: ExampleDatabase | None = None) -> str:
    """Register ``ci``, ``dev`` and ``thorough`` (``database``: where dev and thorough keep
    failing examples; None: hypothesis' default, ``.hypothesis/`` in the working directory) and
    load the one ``HYPOTHESIS_PROFILE`` names (default: ``ci`` under CI=true, else ``dev``)."""
    common = {"deadline": None, "suppress_health_check": _SUPPRESSED, "print_blob": True}
    kept = {} if database is None else {"database": database}
    # ci: no database, so a run is exactly the same examples anywhere.
    settings.register_profile(
        "ci", max_examples=12, derandomize=True, database=None, phases=_NO_SHRINK, **common
    )
    settings.register_profile("dev", max_examples=40, **kept, **common)
    settings.register_profile("thorough", max_examples=400, **kept, **common)
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
    settings.load_profile(name)
    return name
