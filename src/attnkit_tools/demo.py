"""``attnkit-demo``: run every available backend on one problem and compare them.

For each path: forward+backward time, throughput, peak extra memory, and the largest error
against the float64 oracle with the tolerance rule's verdict. Examples::

    attnkit-demo --seq-len 256 --dtype fp32                                      # a CPU
    attnkit-demo --seq-len 4096 --head-dim 128 --heads 16 --causal --dtype bf16  # a GPU

A backend named with --backends that is not registered, or that cannot run on the device, is a
usage error (exit status 2) with the whole reason; one that declines the problem is a skip, and
the exit status is then 1.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch, attnkit and the gate load after the arguments parse: --help stays instant
    import torch

    from attnkit_perf.bench import BenchCase

#: The benchmark cases' element types (the keys of :data:`attnkit_perf.bench.DTYPES`, a
#: module that imports torch), named here so that --help and a usage error need no torch.
DTYPE_NAMES = ("bf16", "fp16", "fp32")

#: Throughput prefixes, largest first: a CPU's GFLOP/s and a GPU's TFLOP/s both print with
#: three significant digits instead of rounding one of them to 0.0.
_PREFIXES = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0))


def format_rate(flop_per_s: float) -> str:
    """``flop_per_s`` in the largest unit that keeps it at least 1, e.g. ``"1.23 TFLOP/s"``."""
    for prefix, size in _PREFIXES:
        if flop_per_s >= size:
            return f"{flop_per_s / size:.3g} {prefix}FLOP/s"
    return f"{flop_per_s:.3g} FLOP/s"


def describe(case: BenchCase, device: torch.device) -> str:
    """One line naming the problem the demo runs: shapes, dtype, mask, pass and its work."""
    mask = "causal" if case.causal else "no mask"
    return (
        f"problem: B={case.batch} Hq={case.q_heads} Hkv={case.kv_heads} N=M={case.seq_len} "
        f"D=Dv={case.head_dim} {case.dtype} {mask}, forward+backward "
        f"({case.flops / 1e9:.3g} GFLOP per step) on {device}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="attnkit-demo",
        description=__doc__.replace("``", "").replace("::", ":"),  # the docstring, as plain text
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--batch", type=_positive, default=1, help="batch size B")
    parser.add_argument("--heads", type=_positive, default=4, help="query heads Hq")
    parser.add_argument("--kv-heads", type=_positive, default=None, help="key/value heads Hkv; None: Hq")
    parser.add_argument("--seq-len", type=_positive, default=512, help="query and key length N = M")
    parser.add_argument("--head-dim", type=_positive, default=64, help="head dim D = Dv")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="bf16", help="element type")
    parser.add_argument("--causal", action="store_true", help="bottom-right causal mask")
    parser.add_argument(
        "--backends", nargs="*", default=None,
        help="paths to run, space-separated (--backends naive tiled); None: every available one",
    )  # fmt: skip
    parser.add_argument("--device", default=None, help="device; None: CUDA when present, else the CPU")
    parser.add_argument("--reps", type=_positive, default=5, help="fewest timed rounds")
    parser.add_argument("--no-check", action="store_true", help="skip the float64 comparison (large N)")
    args = parser.parse_args(argv)
    if args.kv_heads is not None and args.heads % args.kv_heads:
        parser.error(
            f"argument --kv-heads: expected a divisor of --heads {args.heads} (grouped heads), "
            f"got {args.kv_heads}"
        )

    import torch

    import attnkit
    from attnkit.testing import compare_to_reference
    from attnkit_perf.bench import BenchCase, build_runner, make_inputs, median_time_s, peak_extra_bytes

    try:
        device = torch.device(args.device) if args.device else attnkit.registry.default_device()
        torch.empty(1, device=device)  # a device this build or machine lacks raises here, not mid-run
    except (RuntimeError, AssertionError) as err:
        parser.error(f"argument --device: {args.device} cannot be used here: {_first_sentence(err)}")
    named = list(dict.fromkeys(args.backends or []))  # in the order given, each once
    for name in named:
        if problem := _cannot_run(name, device):
            parser.error(f"argument --backends: {problem}")
    names = named or attnkit.available_backends(device)
    template = BenchCase(names[0] if names else "naive", "fwd+bwd", args.batch, args.heads,
                         args.kv_heads or args.heads, args.seq_len, args.head_dim, args.causal,
                         args.dtype)  # fmt: skip
    print(describe(template, device))
    for skipped in [n for n in attnkit.backend_names() if n not in names]:
        print(f"  not run: {skipped} ({_not_run_reason(skipped, device)})")
    header = (
        f"{'backend':<16}{'fwd+bwd ms':>12}{'throughput':>16}{'peak MiB':>10}  accuracy vs float64 oracle"
    )
    for name in names:
        if name != "auto" and attnkit.registry.auto_skip_reason(name, device):  # interpreted: seconds a step
            print(
                f"  warning: {name} runs through Triton's interpreter on the {device.type}: each step "
                "takes seconds (minutes at large N); leave it out with --backends or lower --seq-len"
            )
    print(header)
    print("-" * len(header))
    declined_by_name = []
    for name in names:
        case = BenchCase(name, "fwd+bwd", args.batch, args.heads, args.kv_heads or args.heads,
                         args.seq_len, args.head_dim, args.causal, args.dtype)  # fmt: skip
        try:
            step = build_runner(case, device)
            step()
        except (NotImplementedError, ValueError, torch.OutOfMemoryError) as err:
            print(f"{name:<16}  skipped: {err}")  # the whole reason: its fix is often at the end
            if name in named:
                declined_by_name.append(name)
            continue
        seconds = median_time_s(step, device, budget_s=0.3, min_rounds=args.reps)
        peak_bytes = peak_extra_bytes(step, device)
        peak = None if peak_bytes is None else peak_bytes / 2**20
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
        print(
            f"{name:<16}{1e3 * seconds:12.3f}{format_rate(case.flops / seconds):>16}{peak_text}  {accuracy}"
        )
    if device.type != "cuda":
        print(f"peak MiB: '-' on {device.type}: extra memory is read from CUDA's allocator statistics only")
    if declined_by_name:
        print(f"not run although named with --backends: {', '.join(declined_by_name)} (see above)")
        return 1
    return 0


def _not_run_reason(name: str, device: torch.device) -> str:
    """Why backend ``name`` is not in the table: unavailable on ``device``, forward-only there
    (the demo times forward and backward), or not selected."""
    return _why_not(name, device) or "not selected"


def _why_not(name: str, device: torch.device) -> str | None:
    """Every reason the demo cannot run backend ``name`` on ``device`` (unavailable there,
    forward-only there), all of them at once: a user who fixes one is not met by the next."""
    import attnkit

    reasons = [r for r in (attnkit.unavailable_reason(name, device), _forward_only(name, device)) if r]
    return "; and ".join(reasons) or None


def _forward_only(name: str, device: torch.device) -> str | None:
    """Why the demo, which times forward and backward, cannot run a backend forward-only on
    ``device``; None when it is not."""
    from attnkit.registry import get_backend

    if not get_backend(name).is_forward_only(device):
        return None
    return f"it is forward-only on the {device.type}, and the demo times forward and backward"


def _first_sentence(err: Exception) -> str:
    """The first sentence of an error: torch's unavailable-device errors run to a page."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.split(". ")[0]


def _positive(text: str) -> int:
    """An argument that counts something the demo runs: an int of at least 1 (the oracle's
    comparison needs a nonempty problem; attention itself takes zero sizes, docs/API.md)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def _cannot_run(name: str, device: torch.device) -> str | None:
    """Why backend ``name``, named on the command line, cannot run on ``device`` at all (not
    registered, a broken plugin, or unavailable there), in full; None when it can."""
    import attnkit

    if name == "auto":
        return None
    try:
        reason = _why_not(name, device)
    except (ValueError, attnkit.BackendEntryPointError) as err:  # every valid name, or the plugin's error
        return str(err)
    return None if reason is None else f"{name} cannot run on {device}: {reason}"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default shown, the description's examples kept on their lines."""


if __name__ == "__main__":
    raise SystemExit(main())
