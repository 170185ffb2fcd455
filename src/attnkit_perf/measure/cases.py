"""Benchmark cases: one description of "what is timed", shared by the perf suite, the
performance grid and the report.

A :class:`BenchCase` names a backend, a pass (forward, backward, or both), a call mode and a
shape; it is plain data (:meth:`BenchCase.as_dict` / ``BenchCase(**d)``), so paired mode sends it
to the worker processes of either side, and its field names are those stored in every baseline.
The shape means what attnkit means by it: :attr:`BenchCase.problem` is the
:class:`attnkit.inputs.AttentionProblem` attnkit validates, and the inputs and the derived
metrics (FLOPs, the minimum bytes a pass must write) are computed from it, once, here;
:func:`build_runner` turns a case into a zero-argument callable on fresh random inputs.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import attnkit
from attnkit.inputs import AttentionProblem, check_inputs

PASSES = ("fwd", "bwd", "fwd+bwd")
#: How the call is made and timed: ``eager``; ``compiled``, through
#: ``torch.compile(fullgraph=True)`` (Inductor); ``graph``, one forward captured in a CUDA graph
#: and replayed (no host work per call: what the kernels alone cost where the host would
#: dominate); ``loop``, eager calls timed back to back with no L2 flush between them, as a loop
#: of calls runs: the time per call is then the host's where the host is slower than the GPU.
#: (Every other mode flushes before each call, which gives the host the flush's ~90 us as a
#: head start: a short forward's 50 us of Python and launches are hidden, and only its kernel
#: is timed.)
MODES = ("eager", "compiled", "graph", "loop")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

#: FLOPs of a pass as a multiple of the forward's: the backward does 2.5x the forward's matmul
#: work (5 matmuls against 2, as in FlashAttention's accounting).
_PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


@dataclass(frozen=True)
class BenchCase:
    """One timed configuration: ``seq_len`` query rows against ``kv_len`` keys (``None``: as many
    keys as queries). Decode and prefill-with-cache shapes have ``kv_len > seq_len``; causal is
    bottom-right aligned, as in :func:`attnkit.attention`. ``window``: a sliding window
    ``(left, right)`` (-1: unbounded side), as in :func:`attnkit.attention`, or None."""

    backend: str
    pass_name: str
    batch: int
    q_heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    causal: bool
    dtype: str = "bf16"
    kv_len: int | None = None
    window: tuple[int, int] | None = None
    mode: str = "eager"

    @property
    def keys(self) -> int:
        return self.seq_len if self.kv_len is None else self.kv_len

    def __post_init__(self) -> None:
        if self.pass_name not in PASSES:
            raise ValueError(f"pass_name: expected one of {PASSES}, got {self.pass_name!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        if self.mode == "graph" and self.pass_name != "fwd":
            raise ValueError(f"mode 'graph' captures a forward only; pass_name is {self.pass_name!r}")
        if self.window is not None:  # JSON gives a list back: keep the case hashable
            object.__setattr__(self, "window", tuple(self.window))

    @property
    def flushed(self) -> bool:
        """Whether the L2 is flushed before each timed call (all modes but ``loop``)."""
        return self.mode != "loop"

    @property
    def host_timed(self) -> bool:
        """Whether the host metric (host time per call, :mod:`attnkit_perf.measure.host`) is
        measured on a GPU: the ``loop`` cases, where the host's work sets a call's time. (On the
        CPU every case is host time.)"""
        return self.mode == "loop"

    @property
    def shape_label(self) -> str:
        """Shape without the backend, e.g. ``bf16-B4-H16-N4096-D128-causal``; a window adds
        ``-W1024`` (left only, as with causal) or ``-W1024,16`` (both sides); a mode other than
        eager adds its name (``-compiled``, ``-graph``, ``-loop``)."""
        heads = f"H{self.q_heads}" if self.kv_heads == self.q_heads else f"H{self.q_heads}kv{self.kv_heads}"
        mask = "-causal" if self.causal else ""
        keys = "" if self.kv_len is None else f"-M{self.kv_len}"
        window = ""
        if self.window is not None:
            left, right = self.window
            window = f"-W{left}" if right == -1 or (self.causal and right >= 0) else f"-W{left},{right}"
        mode = "" if self.mode == "eager" else f"-{self.mode}"
        return (
            f"{self.dtype}-B{self.batch}-{heads}-N{self.seq_len}{keys}-D{self.head_dim}{mask}{window}{mode}"
        )

    @property
    def name(self) -> str:
        """Benchmark name, e.g. ``fwd[triton-bf16-B4-H16-N4096-D128-causal]``."""
        return f"{self.pass_name}[{self.backend}-{self.shape_label}]"

    @property
    def group(self) -> str:
        """Benchmarks of one group differ only in backend, so tables put peers side by side."""
        return f"{self.pass_name} {self.shape_label}"

    @functools.cached_property
    def problem(self) -> AttentionProblem:
        """The problem attnkit sees for this case (validated by :func:`attnkit.inputs.check_inputs`
        on tensors of the meta device: shapes only, no memory). ``seq_len`` is its ``q_len``."""
        dtype = DTYPES[self.dtype]
        q = torch.empty(self.batch, self.q_heads, self.seq_len, self.head_dim, device="meta", dtype=dtype)
        k = torch.empty(self.batch, self.kv_heads, self.keys, self.head_dim, device="meta", dtype=dtype)
        return check_inputs(q, k, k, self.causal, None, self.window)

    @property
    def visible_pairs(self) -> float:
        """Query-key pairs the mask leaves: N*M, or N*M - N*(N-1)/2 when causal (bottom-right:
        N^2/2 by the usual accounting for N = M, all for N = 1); with a window, the pairs
        counted exactly from the band (:attr:`attnkit.inputs.AttentionProblem.key_band`)."""
        p = self.problem
        n, m = p.q_len, p.kv_len
        if p.has_window:
            return float(_band_pairs(p))
        if p.causal and n == m:
            return n * n / 2  # the usual accounting of square causal attention
        return n * m - (min(n, m) * (min(n, m) - 1) / 2 if p.causal else 0)

    @property
    def flops(self) -> float:
        """4*B*H*(:attr:`visible_pairs`)*D for the forward, scaled per pass."""
        p = self.problem
        forward = 4.0 * p.batch * p.q_heads * self.visible_pairs * p.head_dim
        return forward * _PASS_FLOP_FACTOR[self.pass_name]

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V: what a memory-bound (decode) forward must read at the least."""
        p = self.problem
        return p.batch * p.kv_heads * p.kv_len * (p.head_dim + p.value_dim) * p.dtype.itemsize

    @property
    def min_bytes(self) -> int:
        """Fewest bytes the pass must allocate: its outputs (O and the float32 log-sum-exp for
        the forward, dQ/dK/dV for the backward). Peak memory over this is overhead."""
        p = self.problem
        item = p.dtype.itemsize
        out = p.batch * p.q_heads * p.q_len * p.value_dim * item
        lse = p.batch * p.q_heads * p.q_len * 4
        grads = p.batch * p.q_heads * p.q_len * p.head_dim * item
        grads += p.batch * p.kv_heads * p.kv_len * (p.head_dim + p.value_dim) * item
        return {"fwd": out + lse, "bwd": grads, "fwd+bwd": out + lse + grads}[self.pass_name]

    def as_dict(self) -> dict:
        """Plain data; ``window`` only when set and ``mode`` only when not eager, so the shapes of
        stored baselines (recorded before either existed) keep their exact form, and a base
        older than them still builds every other case."""
        data = asdict(self)
        if data["window"] is None:
            del data["window"]
        else:
            data["window"] = list(data["window"])
        if data["mode"] == "eager":
            del data["mode"]
        return data


def _band_pairs(p: AttentionProblem) -> int:
    """Visible (query, key) pairs under a window: per row, the keys of its band inside [0, M),
    summed over rows (one vectorised pass over N)."""
    lower, upper = p.key_band
    lower = -p.q_len if lower is None else lower  # row i + lower <= 0 for every row
    upper = p.kv_len if upper is None else upper  # row i + upper >= M - 1 for every row
    rows = torch.arange(p.q_len, dtype=torch.int64)
    first = (rows + lower).clamp(0, p.kv_len)
    last = (rows + upper + 1).clamp(0, p.kv_len)
    return int((last - first).clamp_min(0).sum())


def make_inputs(case: BenchCase, device: torch.device | str, seed: int = 0):
    """Random (never zero) q, k, v and grad_out for ``case`` on ``device``: q and grad_out
    (batch, q_heads, q_len, head_dim), k and v (batch, kv_heads, kv_len, head_dim)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    p = case.problem

    def rand(heads, length, dim):
        return torch.randn((p.batch, heads, length, dim), generator=gen, device=device, dtype=p.dtype)

    q, grad_out = rand(p.q_heads, p.q_len, p.head_dim), rand(p.q_heads, p.q_len, p.value_dim)
    return q, rand(p.kv_heads, p.kv_len, p.head_dim), rand(p.kv_heads, p.kv_len, p.value_dim), grad_out


def build_runner(case: BenchCase, device: torch.device | str, seed: int = 0) -> Callable[[], object]:
    """A zero-argument callable that runs ``case`` once.

    * ``fwd``: the forward with no tensor requiring grad (inference).
    * ``bwd``: the backward alone: the forward runs once here, each call then recomputes
      dQ, dK, dV from the saved graph (``retain_graph``), without accumulating into ``.grad``.
    * ``fwd+bwd``: a training step's attention: forward, then all three gradients.

    ``compiled`` compiles here (the first call), ``graph`` warms up and captures here: the
    callable returned runs only what a steady-state call runs.
    """
    q, k, v, grad_out = make_inputs(case, device, seed)

    # ``window`` only when set: a base older than the argument still runs the other cases.
    options = {"window": case.window} if case.window is not None else {}

    def attend(q, k, v):
        return attnkit.attention(q, k, v, causal=case.causal, backend=case.backend, **options)

    if case.mode == "compiled":
        attend = torch.compile(attend, fullgraph=True)
    if case.mode == "graph":
        return captured(lambda: attend(q, k, v))

    def forward():
        return attend(q, k, v)

    if case.pass_name != "fwd":
        for x in (q, k, v):
            x.requires_grad_()
    if case.pass_name == "fwd":
        runner = forward
    elif case.pass_name == "bwd":
        out = forward()
        runner = lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    else:
        runner = lambda: torch.autograd.grad(forward(), (q, k, v), grad_out)
    if case.mode == "compiled":
        runner()  # compile now (forward and backward graphs), not in the first timed call
    return runner


#: Untimed calls before a capture: they compile the kernels and fill the host-side caches, so
#: that the capture records launches only (a compilation cannot be captured).
_CAPTURE_WARMUP_CALLS = 3


def captured(forward: Callable[[], object]) -> Callable[[], None]:
    """``forward`` captured once in a CUDA graph; the returned callable replays it (same input
    and output buffers each time)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
        for _ in range(_CAPTURE_WARMUP_CALLS):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    # torch does not collect garbage when a capture begins: a graph of an earlier case left in a
    # reference cycle and freed by the collector during this capture would invalidate it.
    gc.collect()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    return graph.replay


# --- The perf suite's grid -------------------------------------------------------------------

#: Backends the GPU suite times, fastest first. Those not registered or unavailable on the
#: device are reported as skipped, so "triton" joins the grid as soon as it registers.
GPU_BACKENDS = ("triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "tiled", "naive")
#: Pure-PyTorch paths are 10-100x slower than the fused ones: they are timed on short shapes only.
SLOW_BACKENDS = ("tiled", "naive")
#: The naive path materialises a float32 (B, H, N, N) score matrix; above this it is not timed.
NAIVE_SCORE_BYTES_MAX = 2 * 1024**3

#: (batch, q_heads, kv_heads, seq_len, head_dim, causal, dtype). 16K tokens per batch and
#: H*D = 2048 as in FlashAttention's published benchmarks, so TFLOP/s compare with their
#: tables. Short and long N, D 64 and 128, causal and not, one fp16 and one GQA shape: every
#: kernel specialisation the fused paths have, with nothing timed twice.
GPU_SHAPES = (
    (16, 16, 16, 1024, 128, True, "bf16"),
    (4, 16, 16, 4096, 128, True, "bf16"),
    (4, 16, 16, 4096, 128, False, "bf16"),
    (1, 16, 16, 16384, 128, True, "bf16"),
    (8, 32, 32, 2048, 64, False, "bf16"),
    (2, 32, 32, 8192, 64, True, "bf16"),
    (4, 16, 16, 4096, 128, True, "fp16"),
    (4, 16, 4, 4096, 128, True, "bf16"),
)
#: The training step (forward then backward) is timed on one shape: elsewhere it is fwd + bwd.
FWD_BWD_SHAPE = GPU_SHAPES[1]
#: Host-bound shapes: the kernel takes a few microseconds, so a loop of calls runs at the speed
#: of attnkit's Python layer and the launches. Timed in ``loop`` mode, they guard the per-call
#: cost (a slower dispatch fails here first).
HOST_SHAPES = ((1, 8, 8, 128, 64, True, "bf16"),)
HOST_BACKENDS = ("triton", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math")
#: More host-bound forwards, in ``loop`` mode, each with the paths that take it: a decode step
#: (one query against a 4K cache), grouped-query attention and a sliding window, whose host
#: work (head grouping, the window's band or mask) the N=128 cases do not run.
#: (backends, (batch, q_heads, kv_heads, seq_len, head_dim, causal, dtype, kv_len, window))
HOST_FORWARDS = (
    (("triton", "sdpa-flash"), (1, 32, 8, 1, 128, True, "bf16", 4096, None)),
    (("triton", "sdpa"), (1, 8, 2, 128, 64, True, "bf16", None, None)),
    (("triton", "sdpa"), (1, 8, 8, 128, 64, True, "bf16", None, (32, 0))),
)
#: How users run attention besides eager calls, on the host-bound shape, as (backend, pass,
#: mode): a training step under torch.compile (a graph break or a recompilation per call fails
#: here) and forwards replayed from a CUDA graph (the kernels' own time, without the host). Only
#: Triton is compiled: Inductor compiles in every worker process, the gate's costliest build,
#: and the SDPA paths compile to PyTorch's own kernel.
MODE_CASES = (("triton", "fwd+bwd", "compiled"), ("triton", "fwd", "graph"), ("sdpa", "fwd", "graph"))
#: Inference shapes, bottom-right causal with fewer queries than keys (Hq 32 / Hkv 8, D 128):
#: decoding one token against a long cache (memory-bound: read K and V once), and a prefill
#: chunk against its cache. (batch, q_heads, kv_heads, seq_len, head_dim, causal, dtype, kv_len)
DECODE_SHAPES = (
    (8, 32, 8, 1, 128, True, "bf16", 32768),
    (1, 32, 8, 1, 128, True, "bf16", 131072),
    (4, 32, 8, 16, 128, True, "bf16", 16384),
)
PREFILL_SHAPES = ((2, 32, 8, 2048, 128, True, "bf16", 8192),)
INFERENCE_BACKENDS = ("triton", "sdpa-flash", "sdpa-cudnn")
#: Sliding-window (local) attention, causal with window (1024, 0) at 16K tokens, on the paths
#: that take a window: triton skips the key blocks outside the band, the SDPA paths get a mask.
#: (batch, q_heads, kv_heads, seq_len, head_dim, causal, dtype, kv_len, window)
WINDOW_SHAPES = ((1, 16, 16, 16384, 128, True, "bf16", None, (1024, 0)),)
WINDOW_BACKENDS = ("triton", "sdpa-efficient", "sdpa")
#: Shapes short enough for the pure-PyTorch paths.
SLOW_BACKEND_SHAPES = (GPU_SHAPES[0], GPU_SHAPES[4])
#: ``backend="auto"``, what a call gets by default: the path its GPU model's measured table puts
#: first for the shape (:mod:`attnkit.auto`), so a changed auto table or dispatch is measured
#: here. It is attnkit's dispatcher, not a registered backend, and runs wherever one of its
#: paths does. Timed on the training shape, forward and training step: the table's two passes.
AUTO_BACKEND = "auto"
AUTO_PASSES = ("fwd", "fwd+bwd")

#: CPU smoke grid: tiny float32 problems, so a CPU-only CI run exercises the whole pipeline.
CPU_BACKENDS = ("tiled", "naive", "sdpa")
CPU_SHAPES = ((1, 2, 2, 128, 32, True, "fp32"), (1, 2, 2, 128, 32, False, "fp32"))


def _cases(backends, shapes, passes) -> list[BenchCase]:
    return [BenchCase(b, p, *shape) for p in passes for shape in shapes for b in backends]


def _naive_fits(case: BenchCase) -> bool:
    return case.batch * case.q_heads * case.seq_len**2 * 4 <= NAIVE_SCORE_BYTES_MAX


def gpu_suite_cases() -> list[BenchCase]:
    """Every case of the GPU perf suite, whether or not its backend is available here."""
    fast = [b for b in GPU_BACKENDS if b not in SLOW_BACKENDS]
    cases = _cases(fast, GPU_SHAPES, ("fwd", "bwd"))
    cases += _cases(fast, (FWD_BWD_SHAPE,), ("fwd+bwd",))
    cases += [
        BenchCase(b, p, *shape, mode="loop")
        for p in ("fwd", "fwd+bwd")
        for shape in HOST_SHAPES
        for b in HOST_BACKENDS
    ]
    cases += [BenchCase(b, p, *shape, mode=m) for b, p, m in MODE_CASES for shape in HOST_SHAPES]
    cases += [BenchCase(b, "fwd", *shape, mode="loop") for backends, shape in HOST_FORWARDS for b in backends]
    cases += _cases(INFERENCE_BACKENDS, DECODE_SHAPES, ("fwd",))
    cases += _cases(INFERENCE_BACKENDS, PREFILL_SHAPES, ("fwd", "bwd"))
    cases += _cases(WINDOW_BACKENDS, WINDOW_SHAPES, ("fwd", "bwd"))
    cases += _cases((AUTO_BACKEND,), (FWD_BWD_SHAPE,), AUTO_PASSES)
    slow = _cases(SLOW_BACKENDS, SLOW_BACKEND_SHAPES, ("fwd", "bwd"))
    cases += [c for c in slow if c.backend != "naive" or _naive_fits(c)]
    return cases


def cpu_suite_cases() -> list[BenchCase]:
    """The CPU smoke grid (host-timed; never compared with a GPU baseline)."""
    return _cases(CPU_BACKENDS, CPU_SHAPES, ("fwd", "bwd"))


def backend_cases(backend: str, gpu: bool, forward_only: bool = False) -> list[BenchCase]:
    """The cases of one backend on the GPU grid (``gpu``) or the CPU smoke grid.

    A backend of the standard grid keeps its cases there, and so its benchmark names (the stored
    baselines key on them). Any other registered backend (a plugin's kernel) is timed on the
    grid's standard shapes: on the GPU the training shapes forward and backward, the training
    step, the host-bound shapes as loops of calls (a decode step, GQA and a window among them),
    decode, prefill and the sliding window (the shapes it declines are skipped with its
    ``supports`` reason); on the CPU the smoke shapes.
    A ``forward_only`` backend has its forwards only.
    """
    standard = [c for c in (gpu_suite_cases() if gpu else cpu_suite_cases()) if c.backend == backend]
    if not standard and not gpu:
        standard = _cases((backend,), CPU_SHAPES, ("fwd", "bwd"))
    elif not standard:
        one = (backend,)
        standard = _cases(one, GPU_SHAPES, ("fwd", "bwd")) + _cases(one, (FWD_BWD_SHAPE,), ("fwd+bwd",))
        standard += [BenchCase(backend, p, *s, mode="loop") for p in ("fwd", "fwd+bwd") for s in HOST_SHAPES]
        standard += [BenchCase(backend, "fwd", *shape, mode="loop") for _, shape in HOST_FORWARDS]
        standard += _cases(one, DECODE_SHAPES, ("fwd",))
        standard += _cases(one, PREFILL_SHAPES + WINDOW_SHAPES, ("fwd", "bwd"))
    return [c for c in standard if c.pass_name == "fwd" or not forward_only]


def suite_cases(
    backends: list[str] | None, gpu: bool, forward_only: frozenset[str] = frozenset()
) -> list[BenchCase]:
    """The perf suite's cases of ``backends`` (None: the standard grid) on the GPU or the CPU."""
    if backends is None:
        return gpu_suite_cases() if gpu else cpu_suite_cases()
    return [c for name in backends for c in backend_cases(name, gpu, name in forward_only)]
