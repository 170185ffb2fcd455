"""The tiled path's memory grows O(N * D), never O(N^2), in forward and backward.

Two measurements, each with the naive path as the control that must show quadratic growth
(so the measurement itself is shown able to fail):

* everywhere: the largest tensor any op allocates during forward + backward (a dispatch mode
  sees every op's outputs). Materialising an N x M score matrix is how O(N^2) memory creeps
  in, and this catches it deterministically, on the CPU too.
* on CUDA: peak allocated bytes beyond the inputs (``torch.cuda.max_memory_allocated``) at
  N = 1K..8K; the measured figures are attached to the test report (``record_property``).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnkit import attention


class _LargestAllocation(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def _train_step(backend, n, device, d=32, heads=2):
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(1, heads, n, d, generator=gen, device=device, requires_grad=True) for _ in range(3)
    )
    grad_out = torch.randn(1, heads, n, d, generator=gen, device=device)
    return lambda: torch.autograd.grad(attention(q, k, v, causal=True, backend=backend), (q, k, v), grad_out)


def _largest_allocation(backend, n, device):
    step = _train_step(backend, n, device)
    with _LargestAllocation() as mode:
        step()
    return mode.largest


@pytest.mark.parametrize(("backend", "min_growth", "max_growth"), [("tiled", 1.5, 2.05), ("naive", 3.9, 4.1)])
def test_largest_intermediate_grows_linearly_for_tiled_and_quadratically_for_naive(
    backend, min_growth, max_growth, device
):
    # N = 512 -> 1024: linear storage doubles, a score matrix quadruples.
    small, large = (_largest_allocation(backend, n, device) for n in (512, 1024))
    growth = large / small
    assert min_growth <= growth <= max_growth, (
        f"{backend}: largest allocation grew {growth:.2f}x ({small} -> {large} bytes) when N doubled; "
        f"expected {min_growth}-{max_growth}x"
    )


def _peak_extra_bytes(step, device):
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="peak memory via the CUDA caching allocator needs a GPU"
)
@pytest.mark.parametrize("backend", ["tiled", "naive"])
def test_peak_memory_growth_on_gpu(backend, record_property):
    device = torch.device("cuda")
    peaks = {}
    for n in (1024, 2048, 4096, 8192):
        step = _train_step(backend, n, device, d=128, heads=16)
        step()  # warm-up: allocator pools and lazy initialisation out of the measurement
        peaks[n] = _peak_extra_bytes(step, device)
        record_property(f"{backend}_peak_extra_bytes_N{n}", peaks[n])
    growth = peaks[8192] / peaks[4096]
    if backend == "tiled":
        assert growth <= 2.2, f"tiled peak grew {growth:.2f}x from N=4096 to 8192: {peaks}"
    else:
        assert growth >= 3.5, f"naive control grew only {growth:.2f}x, the measurement is suspect: {peaks}"
