"""``attnkit-demo``: run every available backend on one problem and compare them.

For each path: forward+backward time, peak extra memory, and the largest error against the
float64 oracle with the tolerance rule's verdict. Example::

    attnkit-demo --seq-len 4096 --head-dim 128 --heads 16 --causal --dtype bf16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnkit
from attnkit.bench.cases import DTYPES, BenchCase, build_runner, make_inputs
from attnkit.testing import compare_to_reference


def _time_ms(fn, device: torch.device, reps: int) -> float:
    """Median milliseconds of ``fn``: triton's do_bench (CUDA events, L2 flushed) on a GPU,
    a synchronised host timer elsewhere."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _peak_extra_mib(fn, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--backends", nargs="*", default=None, help="default: every available one")
    parser.add_argument("--device", default=None)
    parser.add_argument("--reps", type=int, default=5, help="host-timer repetitions (CPU)")
    parser.add_argument("--no-check", action="store_true", help="skip the float64 comparison (large N)")
    args = parser.parse_args(argv)

    device = torch.device(args.device) if args.device else attnkit.registry.default_device()
    names = args.backends or attnkit.available_backends(device)
    print(f"device: {device}")
    for skipped in [n for n in attnkit.backend_names() if n not in names]:
        print(f"  not run: {skipped} ({attnkit.unavailable_reason(skipped, device) or 'not selected'})")
    header = f"{'backend':<16}{'fwd+bwd ms':>12}{'TFLOP/s':>10}{'peak MiB':>10}  accuracy vs float64 oracle"
    print(header)
    print("-" * len(header))
    for name in names:
        case = BenchCase(name, "fwd+bwd", args.batch, args.heads, args.kv_heads or args.heads,
                         args.seq_len, args.head_dim, args.causal, args.dtype)  # fmt: skip
        try:
            step = build_runner(case, device)
            step()
        except (NotImplementedError, ValueError, torch.OutOfMemoryError) as err:
            print(f"{name:<16}  skipped: {str(err).splitlines()[0][:100]}")
            continue
        ms = _time_ms(step, device, args.reps)
        peak = _peak_extra_mib(step, device)
        accuracy = "-"
        if not args.no_check:
            q, k, v, grad_out = make_inputs(case, device)
            checks = compare_to_reference(
                lambda a, b, c, name=name: attnkit.attention(a, b, c, causal=args.causal, backend=name),
                q, k, v, causal=args.causal, scale=None, grad_out=grad_out,
            )  # fmt: skip
            worst = max(checks, key=lambda c: c.error / c.bound)
            verdict = "ok" if all(c.ok for c in checks) else "FAIL"
            accuracy = f"{verdict} (worst {worst.quantity}: {worst.error / worst.bound:.2f} of bound)"
        peak_text = f"{peak:10.1f}" if peak is not None else f"{'-':>10}"
        print(f"{name:<16}{ms:12.3f}{case.flops / ms / 1e9:10.1f}{peak_text}  {accuracy}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
