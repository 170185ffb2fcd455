"""Bottom-right causal attention with N < M on every SDPA path: its causal time over its own
non-causal time on the same shape, forward and forward + backward (target <= 1.2).

    PYTHONPATH=src python tools/lower_right_table.py --out lower_right.json

Shapes (B, N, M): decode with a few queries (4, 16, 16384), decode (8, 1, 4096), prefill
against a cache (2, 2048, 8192); Hq 32, Hkv 8, D 128, bf16. Times are GPU medians from
``attnkit_perf.measure.timing.median_time_s`` (the suite's one timing path: L2 flushed, CUDA
events). Per causal path it also records the SDPA kernel calls of one run (how the problem was
split), any warning (a kernel that declined the split and fell back), and the largest |difference|
of output and gradients from ``sdpa-math`` (a smoke check; the tolerance rule is the correctness
suite's). Markdown on stdout, JSON to --out. About a minute on an H100.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
from attnkit_perf.measure.timing import median_time_s

HQ, HKV, D, DTYPE = 32, 8, 128, torch.bfloat16
SHAPES = [(4, 16, 16384), (8, 1, 4096), (2, 2048, 8192)]  # (B, N, M)
PATHS = ("sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math")
MODES = ("forward", "forward+backward")
TARGET = 1.2


class _KernelCalls(TorchDispatchMode):
    """The SDPA kernel ops one call runs, with their query and key shapes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("aten::_scaled_dot_product_") and "choice" not in name:
            q, k = (args[1], args[2]) if "backward" in name else (args[0], args[1])
            self.calls.append(f"{name.removeprefix('aten::')} q{list(q.shape)} k{list(k.shape)}")
        return func(*args, **(kwargs or {}))


def operands(batch: int, q_len: int, kv_len: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((batch, HQ, q_len, D), (batch, HKV, kv_len, D), (batch, HKV, kv_len, D), (batch, HQ, q_len, D))
    return [torch.randn(s, device="cuda", dtype=DTYPE, generator=gen) for s in shapes]


def step(name: str, causal: bool, mode: str, q, k, v, grad_out):
    """A zero-argument call of one path: the output, or the output and (dq, dk, dv)."""
    if mode == "forward":
        return lambda: attnkit.attention(q, k, v, causal=causal, backend=name)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def forward_backward():
        out = attnkit.attention(*leaves, causal=causal, backend=name)
        return (out, *torch.autograd.grad(out, leaves, grad_out))

    return forward_backward


def largest_differences(results, expected) -> dict[str, float]:
    results = results if isinstance(results, tuple) else (results,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    names = ("out", "dq", "dk", "dv")[: len(results)]
    pairs = zip(names, results, expected, strict=True)
    return {n: (a.float() - b.float()).abs().max().item() for n, a, b in pairs}


def time_shape(batch: int, q_len: int, kv_len: int) -> dict:
    q, k, v, grad_out = operands(batch, q_len, kv_len)
    device = q.device
    row = {"B": batch, "N": q_len, "M": kv_len, "times_us": {}, "kernels": {}, "warnings": {}, "max_diff": {}}
    for mode in MODES:
        expected = step("sdpa-math", True, mode, q, k, v, grad_out)()
        for name, causal in itertools.product(PATHS, (True, False)):
            label = f"{name} {'causal' if causal else 'non-causal'} {mode}"
            if attnkit.unavailable_reason(name) is not None:
                continue
            fn = step(name, causal, mode, q, k, v, grad_out)
            try:
                with warnings.catch_warnings(record=True) as caught, _KernelCalls() as calls:
                    warnings.simplefilter("always")
                    first = fn()
                row["times_us"][label] = median_time_s(fn, device) * 1e6
            except attnkit.UnsupportedProblemError as err:
                row["times_us"][label] = None
                row["warnings"][label] = [f"declined: {str(err)[:300]}"]
                continue
            if causal:
                row["kernels"][label] = calls.calls
                row["max_diff"][label] = largest_differences(first, expected)
            if caught:
                row["warnings"][label] = [str(w.message)[:300] for w in caught]
            del first
        del expected
    return row


def ratio(row: dict, name: str, mode: str) -> float | None:
    causal = row["times_us"].get(f"{name} causal {mode}")
    plain = row["times_us"].get(f"{name} non-causal {mode}")
    return causal / plain if causal and plain else None


def markdown(rows: list[dict]) -> str:
    lines = [
        f"Device: {torch.cuda.get_device_name()}; torch {torch.__version__}; Hq {HQ} Hkv {HKV} D {D} bf16.",
        "",
        f"Causal / non-causal time of each path (target <= {TARGET}; causal and non-causal us in brackets):",
        "",
        "| shape | mode | " + " | ".join(PATHS) + " |",
        "|---" * (len(PATHS) + 2) + "|",
    ]
    for row, mode in itertools.product(rows, MODES):
        cells = []
        for name in PATHS:
            r = ratio(row, name, mode)
            causal = row["times_us"].get(f"{name} causal {mode}")
            plain = row["times_us"].get(f"{name} non-causal {mode}")
            flag = "" if r is None or r <= TARGET else " **over**"
            cells.append("n/a" if r is None else f"{r:.2f}{flag} ({causal:.0f} / {plain:.0f})")
        lines.append(f"| B{row['B']} N{row['N']} M{row['M']} | {mode} | " + " | ".join(cells) + " |")
    lines += ["", "Kernel calls of one causal run, max |diff| from sdpa-math, warnings:", ""]
    for row in rows:
        for label, calls in row["kernels"].items():
            diffs = ", ".join(f"{n} {d:.1e}" for n, d in row["max_diff"][label].items())
            lines.append(
                f"- B{row['B']} N{row['N']} M{row['M']} {label}: {'; '.join(calls) or 'no fused op'}"
            )
            lines.append(f"  - max |diff|: {diffs}")
        for label, messages in row["warnings"].items():
            lines.append(f"- B{row['B']} N{row['N']} M{row['M']} {label}: WARNING {' | '.join(messages)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    rows = [time_shape(*shape) for shape in SHAPES]
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "target": TARGET,
        "rows": rows,
    }
    result["ratios"] = {
        f"B{r['B']} N{r['N']} M{r['M']} {name} {mode}": ratio(r, name, mode)
        for r, name, mode in itertools.product(rows, PATHS, MODES)
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
