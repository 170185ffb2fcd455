"""Validation of attention inputs, done once before any backend runs.

Every backend receives an :class:`AttentionProblem` describing shapes, dtype, device, scale and
masking, so shape logic lives here and nowhere else.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

try:  # NumPy's bool is not a Python bool; accept it where a flag is expected.
    from numpy import bool_ as _numpy_bool
except ImportError:  # pragma: no cover - numpy is optional for torch
    _numpy_bool = bool

#: dtypes any path may accept; individual backends narrow this further.
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class AttentionProblem:
    """One attention call, validated: what every backend's ``supports(problem)`` and ``run``
    receive. Made by :func:`check_inputs` (and so by :func:`attnkit.attention`) before any kernel
    runs; it holds no tensors.

    ``q``: (batch, q_heads, q_len, head_dim); ``k``: (batch, kv_heads, kv_len, head_dim);
    ``v``: (batch, kv_heads, kv_len, value_dim); output: (batch, q_heads, q_len, value_dim).

    Fields:
        batch: B, the batch size of q, k and v.
        q_heads: Hq, query heads; a multiple of ``kv_heads``.
        kv_heads: Hkv, key/value heads (GQA when Hkv < Hq; MQA when Hkv == 1).
        q_len: N, queries per head.
        kv_len: M, keys (and values) per head; M != N is allowed.
        head_dim: D, the last dimension of q and k.
        value_dim: Dv, the last dimension of v and of the output (may differ from D).
        causal: bottom-right causal masking: query i sees key j iff ``j <= i + M - N``
            (:attr:`causal_offset`); with N > M the first N - M rows see no key and output zeros.
        scale: the score multiplier, resolved: ``1 / sqrt(D)`` when the caller gave None.
        dtype: the dtype of q, k, v and the output.
        device: the device of q, k, v and the output.
        window_left, window_right: the sliding window, normalised (see below); None is an
            unbounded side. :attr:`window` gives it in the API's (left, right) form and
            :attr:`key_band` as the band of keys each query sees.
    """

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    value_dim: int
    causal: bool
    scale: float
    dtype: torch.dtype
    device: torch.device
    #: Sliding window, normalised by :func:`check_inputs`: query i sees key j only if
    #: ``i + (M - N) - window_left <= j <= i + (M - N) + window_right``. None: that side is
    #: unbounded, either because it was given as -1 or because it hides no key of this problem
    #: (``left >= M - 1``; ``right >= N - 1``, or any right with causal, which is tighter). So a
    #: problem whose window covers everything equals, and hashes like, the same problem without one.
    window_left: int | None = None
    window_right: int | None = None
    #: The window as the caller gave it, for messages only (:meth:`describe`): a problem compares
    #: and hashes by its normalised window.
    given_window: tuple[int, int] | None = field(default=None, compare=False, repr=False)

    @property
    def group_size(self) -> int:
        """Query heads sharing one key/value head (1 for MHA, q_heads for MQA)."""
        return self.q_heads // self.kv_heads

    @property
    def causal_offset(self) -> int:
        """Bottom-right alignment: query row i sees key j iff ``j <= i + causal_offset``."""
        return self.kv_len - self.q_len

    @property
    def has_window(self) -> bool:
        """Whether a sliding window hides some key (after normalisation)."""
        return self.window_left is not None or self.window_right is not None

    @property
    def window(self) -> tuple[int, int] | None:
        """The normalised window in the API's form, (left, right) with -1 for an unbounded
        side, or None when it hides nothing: ``check_inputs(..., window=p.window)`` gives ``p``."""
        if not self.has_window:
            return None
        return tuple(-1 if side is None else side for side in (self.window_left, self.window_right))

    @property
    def key_band(self) -> tuple[int | None, int | None]:
        """(lower, upper): query row i sees key j (0 <= j < M) iff ``i + lower <= j <= i + upper``;
        None is an unbounded side. The one statement of the masking rule (causal and window);
        :func:`attnkit.reference.visibility` materialises it and every path bounds its loops by it."""
        offset = self.kv_len - self.q_len
        lower = None if self.window_left is None else offset - self.window_left
        if self.window_right is not None:
            upper = offset + self.window_right
        else:
            upper = offset if self.causal else None
        return lower, upper

    @property
    def is_degenerate(self) -> bool:
        """A zero-size dimension: the result is fixed without a kernel (see
        :func:`attnkit.reference.degenerate_attention`)."""
        dims = (self.batch, self.q_heads, self.q_len, self.kv_len, self.head_dim, self.value_dim)
        return 0 in dims

    def describe(self) -> str:
        return (
            f"B={self.batch} Hq={self.q_heads} Hkv={self.kv_heads} N={self.q_len} "
            f"M={self.kv_len} D={self.head_dim} Dv={self.value_dim} causal={self.causal} "
            f"dtype={str(self.dtype).removeprefix('torch.')}"
            + (f" window={self.window}" if self.has_window else "")
            + self._given_window_note()
        )

    def _given_window_note(self) -> str:
        """Where the window the problem runs differs from the caller's: the caller's, and why. (A
        window that hides nothing is no window, and no message needs to name it.)"""
        given = self.given_window
        if not self.has_window or given is None or given == self.window:
            return ""
        why = "a side that hides no key of this problem is unbounded (-1)"
        if self.causal:
            why += "; with causal, the right side always is"
        return f" (given as window={given}; {why})"


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.is_nested:
        raise TypeError(
            f"{name}: expected a dense (B, H, N, D) tensor, got a nested tensor: pad its sequences "
            "(torch.nested.to_padded_tensor) and mask the padding, or call attention once per sequence"
        )
    if x.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout {x.layout}: call .to_dense()")
    if x.dim() != 4:
        raise ValueError(
            f"{name}: expected a 4-D tensor (batch, heads, seq_len, head_dim), "
            f"got {x.dim()}-D with shape {tuple(x.shape)}"
        )
    if x.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name}: expected a floating dtype ({names}), got {x.dtype}")
    return x


def check_causal(causal: object) -> None:
    """A TypeError naming ``causal`` unless it is a bool (Python or NumPy)."""
    if not isinstance(causal, (bool, _numpy_bool)):
        raise TypeError(f"causal: expected a bool (Python or NumPy), got {type(causal).__name__}")


def check_window(window: object) -> tuple[int, int] | None:
    """``window`` as a (left, right) pair of Python ints, each >= -1, or None."""
    if window is None:
        return None
    expected = "None or a (left, right) pair of ints, each >= -1 (-1: unbounded on that side)"
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window: expected {expected}, got {type(window).__name__} {window!r}")
    for side, value in zip(("left", "right"), window, strict=True):
        if isinstance(value, (bool, _numpy_bool)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"window: expected {expected}, got {side} = {value!r} ({type(value).__name__})")
        if value < -1:
            raise ValueError(f"window: expected {expected}, got {side} = {value}")
    return int(window[0]), int(window[1])


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None,
    window: tuple[int, int] | None = None,
) -> AttentionProblem:
    """Check every argument and return the problem; raise before any compute on bad input."""
    q, k, v = (_check_tensor(n, x) for n, x in (("q", q), ("k", k), ("v", v)))
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {x.dtype} differs from q's dtype {q.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: device {x.device} differs from q's device {q.device}")
    (batch, q_heads, q_len, head_dim) = q.shape
    (k_batch, kv_heads, kv_len, k_dim) = k.shape
    (v_batch, v_heads, v_len, value_dim) = v.shape
    if k_batch != batch or v_batch != batch:
        raise ValueError(f"batch size mismatch: q has {batch}, k has {k_batch}, v has {v_batch}")
    if v_heads != kv_heads:
        raise ValueError(f"head count mismatch: k has {kv_heads} heads, v has {v_heads}")
    if k_dim != head_dim:
        raise ValueError(f"head_dim mismatch: q has D={head_dim}, k has D={k_dim}")
    if v_len != kv_len:
        raise ValueError(f"key/value length mismatch: k has M={kv_len}, v has M={v_len}")
    if kv_heads == 0 or q_heads % kv_heads != 0:
        raise ValueError(
            f"q has {q_heads} heads, which is not a multiple of k/v's {kv_heads} heads (GQA needs "
            "Hkv >= 1 and Hq % Hkv == 0)"
        )
    check_causal(causal)
    given_window = check_window(window)
    window_left, window_right = given_window or (-1, -1)
    # Normalise: a side that hides no key of this problem is no bound (see AttentionProblem).
    if window_left == -1 or window_left >= kv_len - 1:
        window_left = None
    if window_right == -1 or causal or window_right >= q_len - 1:
        window_right = None
    if scale is None:
        # D = 0: every score is 0 whatever the scale; 1.0 avoids dividing by zero.
        scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    elif isinstance(scale, (bool, _numpy_bool)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a real number or None, got {type(scale).__name__}")
    elif not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite float, got {scale}")
    else:
        scale = float(scale)
        if abs(scale) > 1.0:
            _check_scale_range(q, k, scale)
    return AttentionProblem(
        batch=batch,
        q_heads=q_heads,
        kv_heads=kv_heads,
        q_len=q_len,
        kv_len=kv_len,
        head_dim=head_dim,
        value_dim=value_dim,
        causal=bool(causal),
        scale=float(scale),
        dtype=q.dtype,
        device=q.device,
        window_left=window_left,
        window_right=window_right,
        given_window=given_window,
    )


def records_backward(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records a backward for a call on ``tensors`` (None entries ignored): grad
    mode is on and one of them requires grad. Every path asks this one question before it picks
    an autograd function or a forward-only run; the compiled memo's ``records_backward`` is its
    C++ twin, held to it by the fast path's parity tests."""
    if not torch.is_grad_enabled():
        return False
    for x in tensors:  # noqa: SIM110 -- any() over a generator costs ~130 ns more a call
        if x is not None and x.requires_grad:
            return True
    return False


#: Headroom below the score dtype's largest float: kernels multiply the scores by log2(e) and
#: subtract the row max (which can double a magnitude) before exp.
_SCORE_HEADROOM = 4.0


def max_scale(q: torch.Tensor, k: torch.Tensor) -> float:
    """The largest |scale| whose scores stay representable for these q (B, Hq, N, D) and
    k (B, Hkv, M, D): finfo(score dtype).max / (4 * max|q| * max|k| * D), the score dtype being
    float32 (float64 for float64 inputs). One reduction over q and k and a host sync."""
    score_max = torch.finfo(torch.float64 if q.dtype == torch.float64 else torch.float32).max
    with torch.no_grad():
        q_max, k_max = (x.abs().amax().item() if x.numel() else 0.0 for x in (q, k))
    bound = q_max * k_max * q.shape[-1] * _SCORE_HEADROOM
    if not math.isfinite(bound):
        return math.inf  # inf/NaN inputs: the result is NaN whatever the scale, as on every path
    return score_max / bound if bound > 0 else math.inf


def _check_scale_range(q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
    """Reject a scale whose product with the scores overflows the score dtype (the softmax of
    inf - inf is NaN on every path). Checked only for |scale| > 1: below, the scaled scores
    are no larger than q.k itself, and the default 1/sqrt(D) pays no reduction or sync."""
    score_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if abs(scale) > torch.finfo(score_dtype).max / _SCORE_HEADROOM:
        limit = f"{torch.finfo(score_dtype).max / _SCORE_HEADROOM:.3g}"
    else:
        limit_value = max_scale(q, k)
        if abs(scale) <= limit_value:
            return
        limit = f"{limit_value:.3g} for these q and k"
    raise ValueError(
        f"scale: |scale| * max|q| * max|k| * D must stay below {score_dtype}'s range / 4, so |scale| "
        f"<= {limit}; got {scale:g}"
    )
