"""The Gluon section of a config table (:mod:`attnkit.triton.gluon.config`): measured on this
GPU by ``python -m attnkit_tools.tune --gluon``, or carried over from another GPU's table by
``--gluon-carry-over``.

Measured, per cell (head dim 64 and 128, causal or not; bf16, B=4, H*D=2048):

1. every candidate of :data:`FORWARD_CANDIDATES` is compiled and checked against the float64
   oracle by attnkit.testing's tolerance rule (forward through the Gluon kernel, backward
   through the Triton one, on N = 300, M = 333), then timed with the gate's protocol at the
   tuning lengths; the one kept is :func:`attnkit_tools.tune.closest_to_best`'s choice;
2. routing: the kept config and the plain Triton forward (this GPU's table) are timed at
   :data:`ROUTING_SEQ_LENS`; the cell is routed from :func:`routed_from`'s N on, or not at all.

Every timing and the provenance (GPU, driver, CUDA, torch, triton, commit) are written with it.
A carried-over section keeps its configs, cells and timings, and says in its provenance where
they were measured, until this GPU re-measures them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import multiprocessing
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import torch

from attnkit.triton.gluon.config import SECTION, HopperForwardConfig, cell_key
from attnkit.triton.gluon.support import GLUON_HEAD_DIMS

#: The lengths at which the plain and the Gluon forward are compared to route a cell.
ROUTING_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)

_TWO = dict(overlap=True, consumers=2, consumer_regs=240, producer_regs=24, maxnreg=168)
_THREE = dict(overlap=True, pingpong=False, persistent=False, consumers=3, consumer_regs=160,
              producer_regs=32, maxnreg=128)  # fmt: skip
#: Variants tried in every cell: two consumer warpgroups (12 warps, 240 registers a consumer
#: thread) plain, ping-pong and persistent; three (16 warps, 160 registers) with 64- and
#: 128-key blocks. A variant that spills or does not fit fails its check and is recorded so.
FORWARD_CANDIDATES: dict[str, HopperForwardConfig] = {
    "2wg-s2": HopperForwardConfig(64, 128, 2, pingpong=False, persistent=False, **_TWO),
    "2wg-pingpong-s2": HopperForwardConfig(64, 128, 2, pingpong=True, persistent=False, **_TWO),
    "2wg-pingpong-persistent-s2": HopperForwardConfig(64, 128, 2, pingpong=True, persistent=True, **_TWO),
    "2wg-persistent-s2": HopperForwardConfig(64, 128, 2, pingpong=False, persistent=True, **_TWO),
    "3wg-n128-s2": HopperForwardConfig(64, 128, 2, **_THREE),
    "3wg-n128-s3": HopperForwardConfig(64, 128, 3, **_THREE),
    "3wg-n64-s4": HopperForwardConfig(64, 64, 4, **_THREE),
}

CELLS = [(d, causal) for d in GLUON_HEAD_DIMS for causal in (False, True)]


def routed_from(gluon_ms: Mapping[int, float], plain_ms: Mapping[int, float]) -> int | None:
    """The smallest N from which the Gluon forward was faster than the plain one at that N and
    every longer N timed (a cell is routed from there on), or None: slower at the longest."""
    start = None
    for n in sorted(gluon_ms, reverse=True):
        if gluon_ms[n] >= plain_ms[n]:
            break
        start = n
    return start


def carried_section(source: Mapping, source_path: str, target_gpu_key: str) -> dict:
    """The Gluon section of the table ``source`` (read from ``source_path``) for the table of
    ``target_gpu_key``, its provenance saying where it was measured: configs, cells and
    timings unchanged."""
    section = source.get(SECTION)
    if not section:
        raise SystemExit(f"--gluon-carry-over {source_path}: that table has no {SECTION!r} section")
    measured = section.get("provenance", {})
    if isinstance(measured.get("measured"), dict) and "source" in measured:  # carried over already
        measured = measured["measured"]
    measured_on = measured.get("gpu_key", source.get("gpu_key", "?"))
    note = f"carried over from the {measured_on} measurement"
    if measured_on != target_gpu_key:
        note += f", not measured on {target_gpu_key}: run python -m attnkit_tools.tune --gluon there"
    carried = dict(section)
    carried["provenance"] = {"source": note, "measured": measured}
    return carried


def write_section(path: str, section: dict) -> None:
    """Set the Gluon section of the table at ``path`` (its Triton families kept as they are)."""
    with _locked(path):
        table = _read(path)
        table[SECTION] = section
        _write(path, table)


def merge_measured(path: str, measured: dict) -> None:
    """Write the cells of ``measured`` (:func:`measure_section` of some cells) into the table at
    ``path``: their configs, routed N (a cell not routed any more is removed) and timings
    replace the old; the other cells stay. Several processes (one a GPU) may merge into one
    table: each holds a lock on it while it reads and writes."""
    with _locked(path):
        table = _read(path)
        section = table.get(SECTION, {})
        if "source" in section.get("provenance", {}):  # carried over: measured here from now on
            section = {"forward": section.get("forward", {}), "routed": section.get("routed", {})}
        section["provenance"] = measured["provenance"]
        for key in ("seq_lens", "routing_seq_lens"):
            section[key] = measured[key]
        section.setdefault("forward", {}).update(measured["forward"])
        routed = section.setdefault("routed", {}).setdefault("forward", {})
        for key in measured["timings_ms"]:
            routed.pop(key, None)
        routed.update(measured["routed"]["forward"])
        section.setdefault("timings_ms", {}).update(measured["timings_ms"])
        table[SECTION] = section
        _write(path, table)


def write_families(path: str, table: dict) -> None:
    """Write a Triton tuning run's ``table`` to ``path``, keeping the Gluon section the file
    has at that moment (measured by ``--gluon``, perhaps in another process)."""
    with _locked(path):
        on_disk = _read(path)
        table = {key: value for key, value in table.items() if key != SECTION}
        if SECTION in on_disk:
            table[SECTION] = on_disk[SECTION]
        _write(path, table)


def _read(path: str) -> dict:
    """The table at ``path``; {} for the empty file :func:`_locked` creates where there was none."""
    with open(path) as f:
        text = f.read()
    return json.loads(text) if text.strip() else {}


def _write(path: str, table: dict) -> None:
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


@contextlib.contextmanager
def _locked(path: str):
    """An exclusive lock on the file at ``path`` itself (POSIX ``flock``: no lock file left
    behind), for writers in parallel processes; the file is created empty if missing."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _gluon_run(q, k, v, problem, cfg: HopperForwardConfig) -> Callable[[], object]:
    from attnkit.triton.gluon.launch import launch

    return lambda: launch(q, k, v, problem.causal, problem.scale, cfg)


def outside_tolerance_rule(head_dim: int, causal: bool, cfg: HopperForwardConfig) -> str:
    """'' if the Gluon forward with ``cfg`` (and the Triton backward from its log-sum-exp) passes
    attnkit.testing's tolerance rule on a ragged problem, else the failed quantities."""
    from attnkit.flash_autograd import flash_attention
    from attnkit.inputs import check_inputs
    from attnkit.testing import compare_to_reference, make_tensor
    from attnkit.triton import TritonImplementation
    from attnkit.triton.gluon.launch import launch

    class GluonForward:
        op_name = None
        triton = TritonImplementation()

        def forward(self, q, k, v, problem):
            return launch(q, k, v, problem.causal, problem.scale, cfg)

        def backward(self, *args):
            return self.triton.backward(*args)

    gen = torch.Generator().manual_seed(0)
    kw = {"dtype": torch.bfloat16, "device": "cuda", "generator": gen}
    q = make_tensor((1, 2, 300, head_dim), **kw)
    k, v = (make_tensor((1, 2, 333, head_dim), **kw) for _ in range(2))
    grad_out = torch.randn(q.shape, generator=gen).to(q)

    def run(a, b, c):
        return flash_attention(GluonForward(), a, b, c, check_inputs(a, b, c, causal, None))

    checks = compare_to_reference(run, q, k, v, causal=causal, scale=None, grad_out=grad_out)
    return "; ".join(c.describe() for c in checks if not c.ok)


def _check(job: tuple[int, bool, str]) -> str:
    """In a worker process: compile one candidate of one cell and check it against the oracle.
    '' when usable, else 'failed: ...' or 'wrong: ...'."""
    head_dim, causal, label = job
    try:
        wrong = outside_tolerance_rule(head_dim, causal, FORWARD_CANDIDATES[label])
    except Exception as error:  # does not compile, or out of resources
        return f"failed: {type(error).__name__}: {str(error)[:200]}"
    return f"wrong: {wrong}" if wrong else ""


def check_all(jobs: list[tuple[int, bool, str]], workers: int) -> dict:
    """{job: '' or why not} for every (head dim, causal, candidate) job, compiled and checked by
    ``workers`` processes (here when ``workers`` <= 1); Triton's on-disk cache then holds the
    binaries the timing runs."""
    if workers <= 1:
        return {job: _check(job) for job in jobs}
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
        return dict(zip(jobs, pool.map(_check, jobs, chunksize=1), strict=True))


def measure_section(seq_lens, log, cells=None, budget_s: float = 0.05, workers: int = 1) -> dict:
    """The Gluon section of ``cells`` ((head dim, causal) pairs; default :data:`CELLS`)
    measured on the current CUDA GPU (module docstring); candidates are compiled and checked
    by ``workers`` processes first, then timed here one at a time."""
    from attnkit_perf.machine import provenance

    from attnkit.triton.gluon import unavailable_reason
    from attnkit.triton.launch import attention_forward, launch_setup
    from attnkit_perf.measure.timing import median_time_s
    from attnkit_tools.tune import _inputs, time_over_best

    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"tune --gluon: the Gluon kernels cannot run here: {reason}")
    device = torch.device("cuda")
    section = {"provenance": provenance(device), "seq_lens": list(seq_lens)}
    section["routing_seq_lens"] = list(ROUTING_SEQ_LENS)
    section["forward"], routed, timings = {}, {}, {}
    cells = CELLS if cells is None else cells
    verdicts = check_all([(d, causal, label) for d, causal in cells for label in FORWARD_CANDIDATES], workers)
    log(f"compiled and checked {len(verdicts)} candidates")
    for head_dim, causal in cells:
        key = cell_key(head_dim, causal)
        cell_timings = timings[key] = {}
        usable = []
        for label in FORWARD_CANDIDATES:
            verdict = verdicts[head_dim, causal, label]
            cell_timings[label] = verdict or {}
            if verdict:
                log(f"  {key} {label:28s} {verdict[:100]}")
            else:
                usable.append(label)
        if not usable:
            log(f"{key}: no candidate passed; the cell keeps the plain kernel")
            continue
        for n in seq_lens:
            q, k, v, _, problem = _inputs(torch.bfloat16, head_dim, causal, n)
            for label in usable:
                run = _gluon_run(q, k, v, problem, FORWARD_CANDIDATES[label])
                ms = 1e3 * median_time_s(run, device, budget_s)
                cell_timings[label][str(n)] = round(ms, 4)
                log(f"  {key} {label:28s} N={n:<6d} {ms:.3f} ms")
        scores = time_over_best({label: cell_timings[label] for label in usable})
        chosen = min(usable, key=scores.__getitem__)
        section["forward"][key] = dataclasses.asdict(FORWARD_CANDIDATES[chosen])
        gluon_ms, plain_ms = {}, {}
        for n in ROUTING_SEQ_LENS:
            q, k, v, _, problem = _inputs(torch.bfloat16, head_dim, causal, n)
            plain = partial(attention_forward, q, k, v, launch_setup(problem))
            gluon = _gluon_run(q, k, v, problem, FORWARD_CANDIDATES[chosen])
            gluon_ms[n] = 1e3 * median_time_s(gluon, device, budget_s)
            plain_ms[n] = 1e3 * median_time_s(plain, device, budget_s)
            log(f"  {key} N={n:<6d} gluon {gluon_ms[n]:.3f} ms, plain {plain_ms[n]:.3f} ms")
        cell_timings["routing"] = {
            "gluon": {str(n): round(t, 4) for n, t in gluon_ms.items()},
            "plain": {str(n): round(t, 4) for n, t in plain_ms.items()},
        }
        start = routed_from(gluon_ms, plain_ms)
        if start is not None:
            routed[key] = start
        log(f"{key}: chosen {chosen}; " + (f"routed from N={start}" if start else "not routed"))
    section["routed"] = {"forward": routed}
    section["timings_ms"] = timings
    return section
