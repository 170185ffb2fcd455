"""attnkit's correctness suite, installed with the package: run it against any registered
backend, from any directory::

    pytest --pyargs attnkit.suite --attnkit-backend NAME      # repeatable; default: every backend
    HYPOTHESIS_PROFILE=ci pytest --pyargs attnkit.suite ...   # fixed, fast examples (CI)

What a kernel must honour, for q (B, Hq, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv), Hq a
multiple of Hkv, any strides, fp16 / bf16 / fp32 / fp64 (it may decline some):

* **The function**: ``softmax(scale * q k^T) v`` per head, query head h reading key/value head
  ``h // (Hq / Hkv)``; output (B, Hq, N, Dv) in q's dtype on q's device.
* **Bottom-right causal**: query i sees key j iff ``j <= i + M - N`` (FlashAttention >= 2.1;
  SDPA's ``is_causal`` is top-left). A sliding window (left, right) keeps key j for query i iff
  ``i + M - N - left <= j <= i + M - N + right`` (-1: unbounded side).
* **Rows that see no key** (causal with N > M, or a window) output **zeros** with zero gradient,
  never NaN.
* **NaN propagates**: a NaN in query row i makes output row i NaN and no other; a NaN in key j
  makes every row that sees key j NaN.
* **The tolerance rule**: the kernel's error against the float64 oracle (max |difference|) is
  at most 2x (output) or 3x (dq, dk, dv) the error of attnkit's naive path computing in the same
  dtype, plus a floor for one rounding and the accumulation order
  (:func:`attnkit.testing.compare_to_reference`, :mod:`attnkit.testing` for the derivation).

A problem the kernel declines, through its ``supports(problem)`` reason or an
:class:`attnkit.UnsupportedProblemError`, is not a failure: a pinned case is skipped with the
kernel's reason, a drawn one is replaced by another draw (the test is skipped, with the reasons,
when every draw was declined), and the run ends with an "attnkit: declined problems" summary.

Modules: ``test_oracle`` (forward and gradients against the oracle over drawn problems:
GQA, M != N, causal, windows, odd lengths and head dims, strided layouts; and the pinned edge
cases), ``test_properties`` (oracle-free properties: convex combinations, scale 0, key
permutation, rows that see no key, windows), ``test_contract`` (the output's dtype, device and
shape; NaN propagation), ``test_scale`` (the scale tier: lengths up to 16K-32K on a GPU, every
head dim, long-KV decode, B * H past 65,535, both sides of each declared dispatch boundary, a
sequence alone and in a batch, the backward repeated bitwise where determinism is declared;
:mod:`attnkit.testing.scale`). attnkit's own repository runs the same tests over its built-in
backends (``tests/correctness/test_suite.py``; the scale tier's large problems there only
through ``tests/correctness/test_suite_reach.py``).
"""
