"""Bottom-right causal attention with N < M on the SDPA paths: the oracle's function, forward and
backward, at the cost of the N x M problem (attnkit.sdpa_lower_right, attnkit.sdpa_split).

On the CPU the split runs on PyTorch's CPU flash kernel (``sdpa-flash``, and ``sdpa`` where
PyTorch picks flash); the cuDNN and efficient kernels share every line but the op calls
(attnkit.sdpa_private_ops) and run here on a GPU.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import backend_params
from strategies import Problem
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import UnsupportedProblemError, attention, sdpa_lower_right, sdpa_private_ops
from attnkit.inputs import AttentionProblem, check_inputs
from attnkit.sdpa_private_ops import private_kernel
from attnkit.sdpa_split import PrefixChunking, SplitLayout, split_attention
from attnkit.testing import assert_close_to_reference, compare_to_reference


def _case(**overrides) -> Problem:
    base = dict(
        batch=2, q_heads=4, kv_heads=2, q_len=24, kv_len=90, head_dim=32, value_dim=32, causal=True,
        dtype=torch.bfloat16, scale=None, q_layout="contiguous", kv_layout="contiguous",
        magnitude="unit", seed=3,
    )  # fmt: skip
    return Problem(**{**base, **overrides})


CASES = {
    "gqa-prefill-with-cache": _case(),
    "mqa-few-queries": _case(batch=1, q_heads=3, kv_heads=1, q_len=5, kv_len=67, head_dim=16, value_dim=16),
    "one-key-of-prefix": _case(
        q_heads=2, kv_heads=2, q_len=40, kv_len=41, head_dim=64, value_dim=64, dtype=torch.float16
    ),
    "strided-cache-large-logits": _case(q_layout="bnhd", kv_layout="strided", magnitude="large", seed=11),
    "float32": _case(q_len=9, kv_len=50, dtype=torch.float32, scale=-0.2),
}

SDPA_PATHS = [p for p in backend_params() if p.values[0].startswith("sdpa")]


def _check(label, fn, problem: Problem, device):
    q, k, v, grad_out = problem.tensors(device)
    checks = compare_to_reference(fn, q, k, v, causal=True, scale=problem.scale, grad_out=grad_out)
    assert_close_to_reference(label, checks)


@pytest.mark.parametrize("backend", SDPA_PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_paths_match_reference_for_fewer_queries_than_keys(backend, case, device):
    problem = CASES[case]
    try:
        _check(
            f"{backend} on {case}",
            lambda a, b, c: attention(a, b, c, causal=True, scale=problem.scale, backend=backend),
            problem,
            device,
        )
    except UnsupportedProblemError as err:  # e.g. flash and float32 on CUDA
        assert backend in str(err), f"rejection of {backend} does not name it: {err}"
        pytest.skip(f"{backend} declines {case} on {device}: {err}")


class _AttentionWork(TorchDispatchMode):
    """Query rows x keys x batch x heads of every SDPA kernel call (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("aten::_scaled_dot_product_") and "choice" not in name:
            q, k = (args[1], args[2]) if "backward" in name else (args[0], args[1])
            self.calls.append((name, tuple(q.shape), tuple(k.shape)))
        return func(*args, **(kwargs or {}))

    @property
    def work(self) -> int:
        return sum(math.prod(q[:3]) * k[2] for _, q, k in self.calls)


@pytest.mark.parametrize("backend", SDPA_PATHS)
def test_no_m_by_m_work_for_few_queries(backend, device):
    """N = 4 queries against M = 512 keys, with gradients: the kernels' total work stays within
    twice (forward + backward) 1.5 x B*Hq*N*M; the square detour does B*Hq*M*M per pass."""
    problem = _case(q_len=4, kv_len=512, dtype=torch.bfloat16)
    q, k, v, grad_out = problem.tensors(device)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with _AttentionWork() as recorder:
        try:
            out = attention(q, k, v, causal=True, backend=backend)
        except UnsupportedProblemError as err:
            pytest.skip(f"{backend} declines the problem on {device}: {err}")
        out.backward(grad_out)
    if not recorder.calls:
        pytest.skip(f"{backend} runs no fused SDPA kernel here (math decomposes into matmuls)")
    bound = 2 * 1.5 * problem.batch * problem.q_heads * problem.q_len * problem.kv_len
    assert recorder.work <= bound, f"{backend}: {recorder.work} > {bound} (calls: {recorder.calls})"


#: The kernels with private ops, by their attnkit name.
FUSED_KERNELS = {
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
}


@pytest.mark.parametrize("name", [p for p in SDPA_PATHS if p.values[0] in FUSED_KERNELS])
@pytest.mark.parametrize(
    "case",
    [
        _case(kv_len=122),  # 98 prefix keys: 7 chunks of 14, no rows prepended to the tail
        _case(q_len=7, kv_len=300, q_heads=6, kv_heads=3, seed=5),  # 7 chunks of 41, 6 rows prepended
        _case(batch=1, kv_heads=1, q_heads=2, q_len=3, kv_len=50, dtype=torch.float16),
    ],
    ids=["even", "pad-rows", "mqa"],
)
def test_chunked_prefix_matches_reference_and_unchunked(name, case, device):
    """The prefix keys cut into several chunks (a policy that sees a large GPU and short chunks)
    computes the oracle's function, as the unchunked split does, gradients included."""
    q, k, v, _ = case.tensors(device)
    problem = check_inputs(q, k, v, True, case.scale)
    backend = FUSED_KERNELS[name]
    if private_kernel(backend, device) is None:
        pytest.skip(f"{name} has no private ops on {device}")
    chunking = PrefixChunking(sm_count=1024, min_chunk_keys=4, max_chunks=8)
    chunks = chunking.chunks(problem, backend)
    assert chunks > 1, f"the policy did not chunk {problem.describe()}"
    for policy, label in ((chunking, f"{chunks} chunks"), (PrefixChunking(sm_count=1), "1 chunk")):
        with _AttentionWork() as recorder:
            try:
                _check(
                    f"{name} split with {label} on {case}",
                    lambda a, b, c, policy=policy: split_attention(
                        name, backend, a, b, c, problem, None, chunking=policy
                    ),
                    case,
                    device,
                )
            except UnsupportedProblemError as err:
                pytest.skip(f"{name} declines the split of {case} on {device}: {err}")
        prefix_batch = recorder.calls[0][1][0]  # the first call is the prefix forward
        expected = chunks if policy is chunking else problem.batch
        assert prefix_batch == expected, f"{label}: prefix call batch {prefix_batch}, expected {expected}"


def _gpu_problem(batch, q_len, kv_len, q_heads=32, kv_heads=8) -> AttentionProblem:
    return AttentionProblem(
        batch=batch, q_heads=q_heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len, head_dim=128,
        value_dim=128, causal=True, scale=128**-0.5, dtype=torch.bfloat16, device=torch.device("cuda"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("batch", "q_len", "kv_len", "expected"),
    [
        (4, 16, 16384, 4),  # 32 tiles on 132 SMs: 4 chunks make 128
        (8, 16, 2048, 2),  # 64 tiles: 2 chunks (more would leave chunks under 512 keys)
        (2, 2048, 8192, 1),  # 1024 tiles fill the GPU
        (1, 4, 600, 1),  # fewer than 2 x 512 prefix keys
    ],
)
def test_chunking_policy_on_an_h100(batch, q_len, kv_len, expected):
    """The policy's answers on an H100 (132 SMs) for Hq 32, Hkv 8, D 128, pinned; no chunks
    without an SM count (the CPU)."""
    problem = _gpu_problem(batch, q_len, kv_len)
    policy = PrefixChunking(sm_count=132)
    assert policy.chunks(problem, SDPBackend.FLASH_ATTENTION) == expected
    layout = SplitLayout(problem, expected)
    assert layout.prefix_len + layout.pad_rows == kv_len - q_len and layout.pad_rows < expected
    cpu = dataclasses.replace(problem, device=torch.device("cpu"))
    assert PrefixChunking().chunks(cpu, SDPBackend.FLASH_ATTENTION) == 1


def _refuse(*args):
    raise RuntimeError("refused for the test")


@pytest.mark.parametrize("refused", ["forward", "backward"])
def test_a_kernel_that_declines_the_split_falls_back_with_a_warning(refused, device, monkeypatch):
    """If a private op raises (say a PyTorch whose schema moved), the call warns and computes the
    oracle's function through the square detour (flash: no mask)."""
    key = ("FLASH_ATTENTION", device.type)
    kernel = sdpa_private_ops._KERNELS.get(key)
    if kernel is None:
        pytest.skip(f"no private flash ops on {device}")
    monkeypatch.setitem(sdpa_private_ops._KERNELS, key, dataclasses.replace(kernel, **{refused: _refuse}))
    monkeypatch.setattr(sdpa_lower_right, "_DECLINED", set())
    problem = CASES["gqa-prefill-with-cache"]
    with pytest.warns(UserWarning, match="refused for the test"):
        _check(
            f"sdpa-flash with its {refused} refused",
            lambda a, b, c: attention(a, b, c, causal=True, backend="sdpa-flash"),
            problem,
            device,
        )
