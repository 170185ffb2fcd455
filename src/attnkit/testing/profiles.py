"""The hypothesis settings profiles of attnkit's test suites, chosen with ``HYPOTHESIS_PROFILE``:

* ``ci``       — **the default**, everywhere (the repository's tests, the installed suite, CI):
                 derandomised, few examples, no deadline, no shrinking: the same examples every
                 run and bounded time on a 2-core CPU or a GPU runner, where shrinking a failure
                 through per-shape kernel compilation can take many minutes; the failing example
                 is still printed in full. It keeps no database.
* ``pr``       — ``ci`` with a third of its examples: the GPU gate's pull-request tier, where
                 each drawn shape compiles its kernels (``.ci/gpu-gate.sh`` picks it for that
                 tier; its nightly run keeps ``ci``).
* ``dev``      — random, a moderate number of examples, for exploring locally. A failing example
                 is saved in hypothesis' database and replayed first on every later run until it
                 passes; replay a whole run with ``--hypothesis-seed=<n>``.
* ``thorough`` — many examples, for a GPU box or a nightly run.

This module is the one place the default is set; the docs point here.
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
#: The profile a run without ``HYPOTHESIS_PROFILE`` gets: a gate gives the same answer every run.
DEFAULT_PROFILE = "ci"

_NO_SHRINK = [Phase.explicit, Phase.generate, Phase.target]


def load_profiles(database: ExampleDatabase | None = None) -> str:
    """Register ``ci``, ``pr``, ``dev`` and ``thorough`` (``database``: where dev and thorough keep
    failing examples; None: hypothesis' default, ``.hypothesis/`` in the working directory) and
    load the one ``HYPOTHESIS_PROFILE`` names, else :data:`DEFAULT_PROFILE`."""
    common = {"deadline": None, "suppress_health_check": _SUPPRESSED, "print_blob": True}
    kept = {} if database is None else {"database": database}
    # ci: no database, so a run is exactly the same examples anywhere.
    settings.register_profile(
        "ci", max_examples=12, derandomize=True, database=None, phases=_NO_SHRINK, **common
    )
    settings.register_profile(
        "pr", max_examples=4, derandomize=True, database=None, phases=_NO_SHRINK, **common
    )
    settings.register_profile("dev", max_examples=40, **kept, **common)
    settings.register_profile("thorough", max_examples=400, **kept, **common)
    name = os.environ.get("HYPOTHESIS_PROFILE") or DEFAULT_PROFILE
    settings.load_profile(name)
    return name
