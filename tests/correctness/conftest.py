"""Shared fixtures of the correctness suite.

Hypothesis profiles (``ci``, ``dev``, ``thorough``; :mod:`attnkit.testing.profiles`) are chosen
with the environment variable HYPOTHESIS_PROFILE. Here the ``dev`` and ``thorough`` profiles keep
failing examples at the repository root (``.hypothesis/``, wherever pytest is started): a local
failure stays red until the bug is fixed. Clear it with ``rm -rf .hypothesis``.

Tests run on ``ATTNKIT_TEST_DEVICE`` if set, else on CUDA when present, else on the CPU. The
generic tests of every backend are attnkit's installed suite (:mod:`attnkit.suite`), collected
here by ``test_suite.py``. A test of every backend asks for the ``backend`` fixture, which the
plugin's own parametrization drives: ``--attnkit-backend NAME`` restricts those tests to the named
backends, as it does for the installed suite.
"""

from __future__ import annotations

import gc
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis.database import DirectoryBasedExampleDatabase
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
import attnkit.api
from attnkit import fastpath
from attnkit.registry import get_backend
from attnkit.sdpa import SDPA_BACKENDS
from attnkit.testing.profiles import load_profiles
from attnkit.testing.selection import test_device

#: One database per checkout, not per working directory: pytest started from tests/ or from the
#: root replays the same saved failures.
load_profiles(DirectoryBasedExampleDatabase(Path(__file__).resolve().parents[2] / ".hypothesis" / "examples"))


DEVICE = test_device()
# Paths interpreted on DEVICE (Triton on the CPU) are ~1000x slower there: they get smaller
# shapes, or are left to the native paths' run of the same code, so the suite stays within CI's time.
INTERPRETED = {name for name in attnkit.backend_names() if get_backend(name).is_interpreted(DEVICE)}


#: attnkit's SDPA paths (those attnkit.builtins registers from attnkit.sdpa's table, whatever a
#: plugin's name starts with), and the dtype their tests use: CUDA's fused kernels take fp16 /
#: bf16 only; the CPU's flash kernel takes fp32.
SDPA_PATHS = list(SDPA_BACKENDS)
SDPA_DTYPE = torch.float32 if DEVICE.type == "cpu" else torch.bfloat16


#: The 16-bit dtypes of a grid of compiled GPU kernels (Triton, Gluon), each compiled once per
#: dtype and config: the PR tier compiles each config in bfloat16; float16, the same kernel source
#: with another element type, runs nightly (docs/TESTING.md, "Tiers").
HALF_DTYPES = [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.nightly)]

#: On CUDA these backends are compositions of ATen ops: the Python the CPU CI runs, over CUDA's
#: ATen kernels (cuBLAS, CUDA's softmax). Those kernels are not attnkit's, so their tests are the
#: nightly tier on a GPU; the oracle and the naive yardstick still run on the GPU inside every
#: CUDA path's test. What CUDA's ATen can change for them is a property declared per device
#: (cuBLAS picks its kernel by batch size): those tests stay in the PR tier. Named here, not
#: declared on the backends: it is this repository's choice of test tier, read by nothing else
#: (the installed suite, the dispatchers and the gate run these backends like any other).
ATEN_REFERENCE_PATHS = frozenset({"naive", "tiled", "sdpa-math"})
DEVICE_DECLARED_PROPERTIES = frozenset(
    {
        "test_a_sequence_gives_the_same_result_alone_and_inside_a_batch",
        "test_repeated_backward_is_bitwise_equal",
    }
)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``nightly`` the tests of :data:`ATEN_REFERENCE_PATHS`, except those of their
    :data:`DEVICE_DECLARED_PROPERTIES`."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("attnkit_backend") if callspec is not None else None
        if backend in ATEN_REFERENCE_PATHS and item.originalname not in DEVICE_DECLARED_PROPERTIES:
            item.add_marker(pytest.mark.nightly)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """With ``ATTNKIT_REQUIRE_DEVICE_INDEPENDENT=1`` (the CPU CI's ``.ci/run``), a
    ``device_independent`` test that skips fails instead: the GPU gate leaves those tests to the
    CPU CI, so one the CPU CI skips is decided by no run at all."""
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and os.environ.get("ATTNKIT_REQUIRE_DEVICE_INDEPENDENT") == "1"
        and item.get_closest_marker("device_independent") is not None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} is device_independent, which the GPU gate leaves to this run, and it "
            f"skipped here ({reason}): make it run without a GPU, or drop the marker"
        )


def skip_if_unavailable(name: str) -> None:
    """Skip the test with the reason backend ``name`` cannot run on DEVICE (``auto`` always can)."""
    reason = None if name == "auto" else attnkit.unavailable_reason(name, DEVICE)
    if reason:
        pytest.skip(reason)


@pytest.fixture
def backend(attnkit_backend: str) -> str:
    """The backend a test runs: attnkit's pytest plugin (:mod:`attnkit_pytest`, the installed
    suite's mechanism) parametrizes ``attnkit_backend`` over every registered backend, or those
    named with ``--attnkit-backend``; one unavailable on the test device is a skip with why."""
    return attnkit_backend


@pytest.fixture(scope="session")
def device() -> torch.device:
    return DEVICE


@pytest.fixture
def no_dead_cuda_graphs():
    """Collect the garbage of earlier tests before a test captures a CUDA graph. torch no longer
    collects when a capture begins, and ``make_graphed_callables`` leaves its graphs in a
    reference cycle (the autograd class it makes for each callable): the cyclic collector frees
    them at whatever allocation crosses its threshold. Freeing a graph while a stream captures is
    not permitted and invalidates the capture (``cudaErrorStreamCaptureInvalidated``): on an H200,
    sdpa-flash's backward capture failed so after the graph tests of other backends in the same
    process, and passed when run alone."""
    gc.collect()


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
    handed), as ``(name, arg_shapes, result_shapes)``. A tensor subclass's metadata queries
    (its layout, its device) reach the mode too; they compute nothing and are not recorded."""

    #: Questions about a tensor, not computations on it (which of them reach the mode depends on
    #: the subclass and on torch's version: torch 2.11 asks a jagged nested tensor its sizes).
    METADATA = frozenset(
        {
            "prim.layout.default",
            "prim.device.default",
            "aten.dim.default",
            "aten.sym_size.default",
            "aten.sym_size.int",
            "aten.sym_stride.default",
            "aten.sym_numel.default",
            "aten.sym_storage_offset.default",
        }
    )

    def __init__(self):
        super().__init__()
        self.ops = []
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in self.METADATA:
            return func(*args, **(kwargs or {}))
        self.ops.append(str(func))
        result = func(*args, **(kwargs or {}))
        results = result if isinstance(result, (tuple, list)) else (result,)
        self.calls.append((str(func), _shapes(args), _shapes(results)))
        return result


def _shapes(values) -> list[tuple[int, ...] | str]:
    # A strided nested tensor has no shape to read.
    return [
        "nested" if x.is_nested and x.layout == torch.strided else tuple(x.shape)
        for x in values
        if isinstance(x, torch.Tensor)
    ]


def sm90_ptxas_report(ptx: str, folder: Path) -> str:
    """``ptxas -v``'s report (registers, spills) of ``ptx`` assembled for sm_90a by the ptxas that
    Triton itself assembles sm_90 with. Triton writes the PTX ``.version`` that this ptxas reads,
    and ships more than one ptxas (a CUDA 12.8 one and a CUDA 13 one, or the one
    ``TRITON_PTXAS_PATH`` names): another of them may refuse that version."""
    from triton.backends.nvidia import compiler

    # Newer Tritons pick the ptxas by architecture (get_ptxas(arch)); older ones have one.
    tool = (
        compiler.get_ptxas(90) if inspect.signature(compiler.get_ptxas).parameters else compiler.get_ptxas()
    )
    ptx_path = folder / "kernel.ptx"
    ptx_path.write_text(ptx)
    command = [tool.path, "-arch=sm_90a", "-v", str(ptx_path), "-o", str(folder / "kernel.cubin")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, f"{tool.path} failed: {done.stderr[-2000:]}"
    return done.stderr
