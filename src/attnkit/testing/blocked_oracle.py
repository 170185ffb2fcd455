"""The three things the tolerance rule compares a kernel with — the float64 oracle, the naive
yardstick in the kernel's dtype, and the magnitudes of the rule's floor — computed over blocks of
(batch entries, query rows), so that memory stays bounded at any size (N = M = 32K, M = 128K,
B * H past 65,535) and the same rule judges the largest problems.

Every row of attention is independent given all keys, so a block of query rows is a problem of
its own: the same keys, its rows' slice of the visibility band (:func:`rows_problem`). The
output, dq and the row-wise maxima are the blocks' results put side by side. dk and dv sum over
every query: the blocks' contributions are summed in the precision the unblocked computation
keeps them in, then rounded as it rounds them:

* oracle: float64 throughout (the sum of float64 partial gradients);
* yardstick (:func:`attnkit.reference.naive_attention` in the input dtype): its dk leaves the
  score matmul in float32 and is rounded to the dtype once, after the sum over the query-head
  group; its dv is ``P^T dO`` per group member from dtype operands (products exact in float32),
  accumulated in float32, rounded to the dtype, then summed over the group. The blocks keep
  those float32 sums and round at the end, so a blocked yardstick differs from an unblocked one
  by summation order only;
* floor terms (:func:`attnkit.testing.term_magnitudes`): row-wise maxima (out, dq) are maxima
  over blocks; the per-key sums (dk, dv) are summed over blocks before their maximum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from attnkit.inputs import AttentionProblem
from attnkit.reference import attention_scores, attention_weights, naive_attention, score_dtype

#: Most score elements (batch entries x query heads x rows x keys) one block materialises, per
#: device type: ~15 float64 tensors of that size live at once (scores, weights, the floor's
#: terms, autograd's saved tensors), ~8 GiB on a GPU and ~0.5 GiB on a CPU.
BLOCK_SCORES = {"cuda": 2**26, "cpu": 2**22}


def rows_problem(problem: AttentionProblem, batch: int, start: int, stop: int) -> AttentionProblem:
    """The problem of query rows ``start:stop`` of ``problem`` for ``batch`` batch entries: the
    same keys, each row seeing exactly the keys it sees in ``problem`` (the band of
    :attr:`AttentionProblem.key_band` shifted by ``start``, written as a window that need not be
    normalised: it is never checked, only read by the oracle's visibility)."""
    rows = stop - start
    if (start, stop) == (0, problem.q_len):
        return dataclasses.replace(problem, batch=batch)
    lower, upper = problem.key_band
    offset = problem.kv_len - rows  # the block's own bottom-right offset
    return dataclasses.replace(
        problem,
        batch=batch,
        q_len=rows,
        window_left=None if lower is None else offset - (lower + start),
        window_right=None if upper is None else upper + start - offset,
    )


def blocks(problem: AttentionProblem) -> Iterator[tuple[slice, slice]]:
    """(batch slice, query-row slice) blocks covering ``problem``, each at most
    :data:`BLOCK_SCORES` score elements (or one row of one batch entry)."""
    p = problem
    budget = BLOCK_SCORES.get(p.device.type, BLOCK_SCORES["cpu"])
    per_batch = p.q_heads * p.q_len * max(p.kv_len, 1)
    batch_step = max(1, budget // max(per_batch, 1))
    row_step = p.q_len if batch_step > 1 else max(1, budget // (p.q_heads * max(p.kv_len, 1)))
    for b0 in range(0, p.batch, batch_step):
        for r0 in range(0, p.q_len, row_step):
            yield slice(b0, min(b0 + batch_step, p.batch)), slice(r0, min(r0 + row_step, p.q_len))


@dataclass
class RuleInputs:
    """What :func:`attnkit.testing.compare_to_reference` measures a kernel against, per quantity
    (``out``, and ``dq``, ``dk``, ``dv`` when a gradient of the output was given): the oracle's
    float64 result, the yardstick's result in the input dtype, and the floor's (T, R)."""

    reference: dict[str, torch.Tensor]
    baseline: dict[str, torch.Tensor]
    magnitudes: dict[str, tuple[float, float]]


def rule_inputs(q, k, v, grad_out, problem: AttentionProblem) -> RuleInputs:
    """:class:`RuleInputs` for q (B, Hq, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv) and
    ``grad_out`` (B, Hq, N, Dv) or None, block by block (:func:`blocks`)."""
    p = problem
    grads = grad_out is not None
    acc = score_dtype(q.dtype)
    dev = q.device
    shapes = {"out": (p.batch, p.q_heads, p.q_len, p.value_dim)}
    if grads:
        shapes |= {"dq": q.shape, "dk": k.shape, "dv": v.shape}
    reference = {n: torch.zeros(s, dtype=torch.float64, device=dev) for n, s in shapes.items()}
    baseline = {n: torch.zeros(s, dtype=q.dtype, device=dev) for n, s in shapes.items()}
    maxima = {name: [0.0, 0.0] for name in shapes}
    q_rows = (p.batch, p.kv_heads, p.group_size, p.q_len)
    for bs, rs in blocks(p):
        if rs.start == 0:  # a new batch slice: its per-key sums start from zero
            n_batch = bs.stop - bs.start
            key_sums = {}
            if grads:
                dk_acc = torch.zeros(n_batch, p.kv_heads, p.kv_len, p.head_dim, dtype=acc, device=dev)
                dv_acc = torch.zeros(n_batch, *q_rows[1:3], p.kv_len, p.value_dim, dtype=acc, device=dev)
        block = rows_problem(p, bs.stop - bs.start, rs.start, rs.stop)
        qb, kb, vb = q[bs, :, rs], k[bs], v[bs]
        gb = None if grad_out is None else grad_out[bs, :, rs]
        _oracle_block(qb, kb, vb, gb, block, reference, bs, rs)
        out, dq, dk32, dv32 = _yardstick_block(qb, kb, vb, gb, block)
        baseline["out"][bs, :, rs] = out
        terms = _term_block(qb, kb, vb, gb, block)
        for name in ("out", "dq"):
            if name in terms:
                for i, x in enumerate(terms[name]):
                    maxima[name][i] = max(maxima[name][i], float(x))
        if grads:
            baseline["dq"][bs, :, rs] = dq
            dk_acc += dk32
            dv_acc += dv32
            for name in ("dk", "dv"):
                before = key_sums.get(name, (0.0, 0.0))
                key_sums[name] = [a + b for a, b in zip(before, terms[name], strict=True)]
        if rs.stop == p.q_len and grads:  # the batch slice is complete
            baseline["dk"][bs] = dk_acc.to(k.dtype)
            baseline["dv"][bs] = dv_acc.to(v.dtype).sum(2)
            for name, sums in key_sums.items():
                for i, x in enumerate(sums):
                    largest = x.max().item() if isinstance(x, torch.Tensor) and x.numel() else 0.0
                    maxima[name][i] = max(maxima[name][i], largest)
    return RuleInputs(reference, baseline, {name: (t, r) for name, (t, r) in maxima.items()})


def _oracle_block(q, k, v, grad_out, block, reference, bs, rs) -> None:
    """The float64 oracle on one block, written (out, dq) or added (dk, dv) into ``reference``."""
    leaves = [x.detach().double().requires_grad_(grad_out is not None) for x in (q, k, v)]
    with torch.enable_grad():
        out = naive_attention(*leaves, block)
        reference["out"][bs, :, rs] = out.detach()
        if grad_out is not None:
            dq, dk, dv = torch.autograd.grad(out, leaves, grad_out.double())
            reference["dq"][bs, :, rs] = dq
            reference["dk"][bs] += dk
            reference["dv"][bs] += dv


def _yardstick_block(q, k, v, grad_out, block):
    """The naive path in q's dtype on one block: (out, dq, dk, dv), dk and dv as float32 (float64
    for float64 inputs) partial sums, dv per group member (B, Hkv, G, M, Dv): see the module
    docstring for where they are rounded."""
    acc = score_dtype(q.dtype)
    q_leaf = q.detach().requires_grad_(grad_out is not None)
    # k enters the scores upcast: the gradient to the upcast copy is the one summed in float32.
    k_acc = k.detach().to(acc).requires_grad_(grad_out is not None)
    with torch.enable_grad():
        out = naive_attention(q_leaf, k_acc, v.detach(), block)
        if grad_out is None:
            return out.detach(), None, None, None
        dq, dk = torch.autograd.grad(out, (q_leaf, k_acc), grad_out.to(out.dtype))
    weights = attention_weights(q.detach(), k.detach(), block).to(v.dtype)  # (B, Hkv, G, n, M)
    d_out = grad_out.reshape(*weights.shape[:-1], block.value_dim)
    dv = weights.to(acc).transpose(-1, -2) @ d_out.to(acc)
    return out.detach(), dq, dk, dv


def _term_block(q, k, v, grad_out, block) -> dict[str, tuple]:
    """The floor's terms on one block (see :func:`attnkit.testing.term_magnitudes`): for out and
    dq their maxima (T, R); for dk and dv their per-key sums over the block's rows, to be summed
    over blocks and then maximised."""
    problem = block
    q, k, v = (x.detach().double() for x in (q, k, v))
    probs = attention_weights(q, k, problem)  # (B, Hkv, G, n, M)
    scores = attention_scores(q, k, problem)
    row_max = scores.amax(-1, keepdim=True)
    conditioning = 1 + torch.nan_to_num((scores.abs() + row_max.abs()), posinf=0.0)
    cond_probs = probs * conditioning
    out_terms = cond_probs @ v.abs().unsqueeze(2)
    result = {"out": (_largest(out_terms), 0.0)}
    if grad_out is None:
        return result
    dog = grad_out.double().reshape(*probs.shape[:-1], problem.value_dim)
    dprobs = dog @ v.unsqueeze(2).transpose(-1, -2)
    delta = (probs * dprobs).sum(-1, keepdim=True)
    abs_ds = cond_probs * (dprobs.abs() + delta.abs())
    scale = abs(problem.scale)
    # |O| is bounded by sum_j P_ij |v_j| (out_terms without the conditioning factor).
    stored_o = probs * ((dog.abs() * (probs @ v.abs().unsqueeze(2))).sum(-1, keepdim=True))
    qg = q.reshape(*probs.shape[:-1], problem.head_dim)
    result["dv"] = ((cond_probs.transpose(-1, -2) @ dog.abs()).sum(2), 0.0)
    result["dq"] = (
        scale * _largest(abs_ds @ k.abs().unsqueeze(2)),
        scale * _largest(stored_o @ k.abs().unsqueeze(2)),
    )
    result["dk"] = (
        scale * (abs_ds.transpose(-1, -2) @ qg.abs()).sum(2),
        scale * (stored_o.transpose(-1, -2) @ qg.abs()).sum(2),
    )
    return result


def _largest(x: torch.Tensor) -> float:
    return x.max().item() if x.numel() else 0.0
