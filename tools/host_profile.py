"""cProfile of attnkit calls on a GPU host: where the per-call host time goes.

Usage (on a GPU): ``PYTHONPATH=src python tools/host_profile.py > host_profile.txt``
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

from attnkit import attention

DEVICE = torch.device("cuda")
#: name: (backend, (B, Hq, Hkv, N, M, D), with a backward)
CASES = {
    "triton-fwd-small": ("triton", (1, 8, 8, 128, 128, 64), False),
    "triton-fwdbwd-small": ("triton", (1, 8, 8, 128, 128, 64), True),
    "sdpa-flash-fwd-small": ("sdpa-flash", (1, 8, 8, 128, 128, 64), False),
    "triton-decode-B8-M4096": ("triton", (8, 32, 8, 1, 4096, 128), False),
    "triton-decode-B4-N16-M16384": ("triton", (4, 32, 8, 16, 16384, 128), False),
}


def make_step(backend: str, shape, backward: bool):
    b, hq, hkv, n, m, d = shape
    gen = torch.Generator(device=DEVICE).manual_seed(0)

    def rand(heads, length):
        x = torch.randn(b, heads, length, d, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        return x.requires_grad_(backward)

    q, k, v = rand(hq, n), rand(hkv, m), rand(hkv, m)
    if not backward:
        return lambda: attention(q, k, v, causal=True, backend=backend)
    grad = torch.randn_like(q)
    return lambda: attention(q, k, v, causal=True, backend=backend).backward(grad)


def main() -> None:
    for name, (backend, shape, backward) in CASES.items():
        step = make_step(backend, shape, backward)
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        calls = 500 if backward else 2000
        start = time.perf_counter()
        for _ in range(calls):
            step()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        host, wall = 1e6 * (issued - start) / calls, 1e6 * (done - start) / calls
        print(f"== {name}: host {host:.1f} us/call, wall {wall:.1f} us/call")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            step()
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue()[:6000])


if __name__ == "__main__":
    main()
