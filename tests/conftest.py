"""Test configuration of the whole tree; pytest loads it before any test module or conftest below.

One environment default, set here so that a plain ``pytest`` runs the suite as CI does, with
no variable to know (an explicit value in the environment always wins):

* ``TRITON_INTERPRET=1`` when no CUDA device is present: the Triton tests then run through
  Triton's interpreter on the CPU instead of being skipped. Triton reads the variable once, when
  ``@triton.jit`` decorates the kernels, so it must be set before ``attnkit`` is first imported.
  That is why the perf plugin (``attnkit_perf.plugin``, which imports ``attnkit``) is loaded
  from here, after the variable is set, and not with ``-p`` in pyproject's ``addopts``: plugins
  named there are imported before any conftest.

Hypothesis' profile is ``ci`` unless ``HYPOTHESIS_PROFILE`` names another: the default is set in
one place, :mod:`attnkit.testing.profiles`.

Inductor's compile cache goes to pytest's cache folder (``.pytest_cache/d/attnkit-torchinductor``,
kept for the next run), or under ``-p no:cacheprovider`` to a temporary folder removed when the
run ends, as in a run of the installed suite (:func:`attnkit_pytest.keep_compile_cache_in`); one
run compiles into one cache.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile

import pytest

from attnkit_pytest import keep_compile_cache_in


def _cuda_present() -> bool:
    # torch, not attnkit: importing attnkit here would build the kernels before the variable is set.
    import torch

    return torch.cuda.is_available()


#: Set before anything imports torch: importing torch._dynamo (attnkit, through the plugins
#: below) makes the cache folder and writes torch's default into the variable. This process
#: removes the folder when it exits; xdist workers and the processes tests start inherit it.
_RUN_INDUCTOR_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _RUN_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="attnkit-torchinductor-")
    atexit.register(shutil.rmtree, _RUN_INDUCTOR_CACHE, ignore_errors=True)
keep_compile_cache_in(_RUN_INDUCTOR_CACHE or os.environ["TORCHINDUCTOR_CACHE_DIR"])

#: Whether something imported attnkit before this file ran (a plugin named with ``-p`` or an
#: entry point): then TRITON_INTERPRET set below comes too late for the kernels already built.
_ATTNKIT_ALREADY_IMPORTED = "attnkit" in sys.modules

if "TRITON_INTERPRET" not in os.environ and not _cuda_present():
    os.environ["TRITON_INTERPRET"] = "1"

#: attnkit's own plugin (``--attnkit-backend``; an installed attnkit also loads it as the entry point
#: of the same name) and the perf gate's.
pytest_plugins = ("attnkit_pytest", "attnkit_perf.plugin")


def pytest_configure(config: pytest.Config) -> None:
    """Keep Inductor's cache in the run's own folders; refuse a run whose Triton tests would all be
    skipped because the interpreter came too late."""
    cache = getattr(config, "cache", None)
    if _RUN_INDUCTOR_CACHE is not None and cache is not None:  # kept for the next run
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.mkdir("attnkit-torchinductor"))
    if not _ATTNKIT_ALREADY_IMPORTED or os.environ.get("TRITON_INTERPRET") != "1" or _cuda_present():
        return
    if importlib.util.find_spec("triton") is None:
        return  # no Triton at all: its tests skip with that reason, which is the truth
    import attnkit

    reason = attnkit.unavailable_reason("triton", "cpu")
    if reason:
        raise pytest.UsageError(
            "attnkit was imported before tests/conftest.py set TRITON_INTERPRET=1 (a plugin named "
            "with -p or an entry point), so every Triton test would be skipped: "
            f"{reason}. Set TRITON_INTERPRET=1 in the environment, or load that plugin later."
        )
