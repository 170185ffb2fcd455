"""Shared fixtures of the correctness suite.

Hypothesis profiles, chosen with the environment variable HYPOTHESIS_PROFILE:

* ``ci``       — derandomised, few examples, no deadline, no shrinking: the same examples every
                 run and bounded time on a 2-core CPU or a GPU runner, where shrinking a failure
                 through per-shape kernel compilation (cuDNN) can take many minutes; the failing
                 example is still printed in full (the default under CI=true).
* ``dev``      — the default locally: random, a moderate number of examples. A failing example
                 is saved in hypothesis' database at the repository root (``.hypothesis/``,
                 wherever pytest is started) and replayed first on every later run until it
                 passes: a local failure stays red until the bug is fixed. Clear it with
                 ``rm -rf .hypothesis``; replay a whole run with ``--hypothesis-seed=<n>``.
* ``thorough`` — many examples, for a GPU box or a nightly run.

Tests run on ``ATTNKIT_TEST_DEVICE`` if set, else on CUDA when present, else on the CPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
import attnkit.api
from attnkit import fastpath

#: One database per checkout, not per working directory: pytest started from tests/ or from the
#: root replays the same saved failures.
_DATABASE = DirectoryBasedExampleDatabase(Path(__file__).resolve().parents[2] / ".hypothesis" / "examples")
# filter_too_much: a backend that declines most drawn problems (sdpa-cudnn: no fp32, few odd
# head dims) makes tests reject() them by design; on the H100 it tripped the health check.
_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
_COMMON = {"deadline": None, "suppress_health_check": _SUPPRESSED}
_NO_SHRINK = [Phase.explicit, Phase.generate, Phase.target]
# ci: no database, so a run is exactly the same examples anywhere, saved local failures aside.
settings.register_profile(
    "ci", max_examples=12, derandomize=True, database=None, phases=_NO_SHRINK, print_blob=True, **_COMMON
)
settings.register_profile("dev", max_examples=40, print_blob=True, database=_DATABASE, **_COMMON)
settings.register_profile("thorough", max_examples=400, print_blob=True, database=_DATABASE, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _select_device() -> torch.device:
    return torch.device(os.environ.get("ATTNKIT_TEST_DEVICE") or attnkit.registry.default_device())


DEVICE = _select_device()
# Fused paths that only run through the Triton interpreter on the CPU are ~1000x slower there:
# they get smaller shapes so the suite stays within CI's time.
INTERPRETED = {"triton"} if DEVICE.type == "cpu" else set()


#: attnkit's SDPA paths, and the dtype their tests use: CUDA's fused kernels take fp16 / bf16
#: only; the CPU's flash kernel takes fp32.
SDPA_PATHS = [name for name in attnkit.backend_names() if name.startswith("sdpa")]
SDPA_DTYPE = torch.float32 if DEVICE.type == "cpu" else torch.bfloat16


def skip_if_unavailable(name: str) -> None:
    """Skip the test with the reason backend ``name`` cannot run on DEVICE (``auto`` always can)."""
    reason = None if name == "auto" else attnkit.unavailable_reason(name, DEVICE)
    if reason:
        pytest.skip(reason)


def backend_params() -> list:
    """Every registered backend; those unavailable here are skipped with the reason."""
    params = []
    for name in attnkit.backend_names():
        reason = attnkit.unavailable_reason(name, DEVICE)
        marks = [pytest.mark.skip(reason=f"{name} unavailable on {DEVICE}: {reason}")] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.fixture(scope="session")
def device() -> torch.device:
    return DEVICE


@pytest.fixture(autouse=True)
def _return_cached_gpu_memory():
    """Give the GPU memory a test's caching allocator kept back to the driver after the test.
    Many xdist workers share one GPU: on the H100, 12 workers of the thorough profile each kept
    what their largest test had reserved, and Triton then failed to load a module ("out of
    memory") for problems of a few hundred bytes."""
    yield
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


@pytest.fixture(params=["python-memo", "compiled-memo"])
def memo_in_front(request, monkeypatch) -> str:
    """attention()'s repeated calls through the Python memo alone, then through the compiled memo
    (:mod:`attnkit.fastpath`) in front of it; the compiled case is skipped where it is not built."""
    if request.param == "python-memo":
        monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    elif fastpath.memo is None:
        pytest.skip(f"attnkit.fastpath: {fastpath.status}")
    else:
        monkeypatch.setattr(attnkit.api, "_compiled_memo", fastpath.memo)
    return request.param


def python_functions_run(step) -> list[str]:
    """``module:function`` of every Python function ``step`` enters, in order."""
    entered = []

    def profile(frame, event, arg):
        if event == "call":
            entered.append(f"{frame.f_globals.get('__name__')}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return entered


class RecordOps(TorchDispatchMode):
    """Records every aten op that runs: its name (to prove validation happens before any
    compute) and the shapes of its tensor arguments and results (to prove what a kernel was
    handed), as ``(name, arg_shapes, result_shapes)``."""

    def __init__(self):
        super().__init__()
        self.ops = []
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        result = func(*args, **(kwargs or {}))
        results = result if isinstance(result, (tuple, list)) else (result,)
        self.calls.append((str(func), _shapes(args), _shapes(results)))
        return result


def _shapes(values) -> list[tuple[int, ...]]:
    return [tuple(x.shape) for x in values if isinstance(x, torch.Tensor)]
