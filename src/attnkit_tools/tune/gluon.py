"""The Gluon section of a config table (:mod:`attnkit.triton.gluon.config`): measured on this
GPU by ``python -m attnkit_tools.tune.configs --gluon``, or carried over from another GPU's table by
``--gluon-carry-over``.

Measured, per cell (head dim 64 and 128, causal or not; bf16, H*D=2048) and per pass
(``--passes``, both by default):

* forward (B=4): every candidate of :data:`FORWARD_CANDIDATES` is compiled and checked against
  the float64 oracle by attnkit.testing's tolerance rule (forward through the Gluon kernel,
  backward through the Triton one, on N = 300, M = 333), then timed with the gate's protocol at
  the tuning lengths beside the plain Triton forward (this GPU's table); the one kept is
  :func:`chosen_as_routed`'s choice;
* backward (B=4, 2 at N=16384): every candidate of :func:`backward_candidates` is compiled and
  checked against the oracle (the plain forward, then the Gluon backward, on N = 300, M = 333
  with grouped heads), then each and the plain Triton backward are timed at
  :data:`ROUTING_SEQ_LENS` (``triton.testing.do_bench`` medians, the delta preprocess included
  in both); the one kept is the closest to the best at every length as the cell would run,
  the plain backward below the candidate's routing N (:func:`chosen_as_routed`).

The candidates are timed by their launchers: a fair comparison among them, which share one host
path, but not of the Gluon kernels against the plain ones, which :func:`attnkit.attention`
launches another way. So where a pass of a cell is routed is decided last, through the public
call, at :data:`ROUTING_SEQ_LENS` (:mod:`attnkit_tools.tune.routing`), and those timings are
kept under each cell's ``public_call``. Every timing and the provenance (GPU, driver, CUDA,
torch, triton, commit) are written with it. A carried-over section keeps its configs, cells and
timings, and says in its provenance where they were measured, until this GPU re-measures them;
so does a recorded measurement (:data:`RECORDED_BACKWARD`, written by
``--gluon-recorded-backward``).
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

from attnkit.triton.gluon.config import PASSES, SECTION, BackwardConfig, HopperForwardConfig, cell_key
from attnkit.triton.gluon.support import GLUON_HEAD_DIMS
from attnkit_tools.tune.ranking import backward_batch, time_over_best
from attnkit_tools.tune.routing import measure_routing, routed_from

#: The lengths at which the plain and the Gluon kernels are compared to route a cell.
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

#: Backward variants: the dK/dV pass on Gluon with the plain dQ pass (``dkdv``), or with the
#: Gluon dQ pass over 64- or 128-key blocks; the causal cells also with the masked row blocks
#: in a loop of their own (``-split``; no effect without a mask).
BACKWARD_CANDIDATES: dict[str, BackwardConfig] = {
    "dkdv": BackwardConfig(gluon_dq=False),
    "dkdv+dq": BackwardConfig(),
    "dkdv+dq-n128": BackwardConfig(dq_block_n=128),
    "dkdv-split": BackwardConfig(gluon_dq=False, split_masked=True),
    "dkdv+dq-n128-split": BackwardConfig(dq_block_n=128, split_masked=True),
}

CELLS = [(d, causal) for d in GLUON_HEAD_DIMS for causal in (False, True)]


def backward_candidates(causal: bool) -> list[str]:
    """The labels of :data:`BACKWARD_CANDIDATES` tried in a cell."""
    return [label for label, cfg in BACKWARD_CANDIDATES.items() if causal or not cfg.split_masked]


#: The Gluon backward's cells as measured on an H200 before the tuner measured the backward
#: (the kernel's own A/B runs, recorded in docs/VERIFICATION.md), written into that GPU's table
#: by ``tune --gluon-recorded-backward`` until ``tune --gluon --passes backward`` re-measures
#: them there. At D = 64 the Gluon dQ pass was slower than the plain one, and three consumer
#: warpgroups no faster than two; at D = 128 causal the dK/dV pass beat the plain one only with
#: ``split_masked``, which made D = 64 causal slower.
RECORDED_BACKWARD = {
    "gpu_key": "nvidia-h200",
    "configs": {
        "d64-full": BackwardConfig(gluon_dq=False),
        "d64-causal": BackwardConfig(gluon_dq=False),
        "d128-full": BackwardConfig(dq_block_n=128),
        "d128-causal": BackwardConfig(dq_block_n=128, split_masked=True),
    },
    "routed_from": 4096,
    "measured": {
        "gpu_key": "nvidia-h200",
        "device_name": "NVIDIA H200",
        "measured": (
            "H200, bf16, H*D=2048, B=4 (2 at 16K), N=4096/8192/16384, do_bench medians against the "
            "plain backward and cuDNN in one process; cuDNN/ours 0.81-0.90 where the plain backward "
            "is 0.76-0.83; routed from N=4096 (the shortest length measured) in every cell"
        ),
        "commit": "5422ca1 and 77f7d6e (recorded as literals in attnkit/triton/gluon/backward_launch.py)",
    },
}


def recorded_backward(target_gpu_key: str) -> dict:
    """:data:`RECORDED_BACKWARD` as the backward pass of a section (configs, routed cells and
    provenance) for the table of ``target_gpu_key``: only the GPU it was measured on."""
    measured_on = RECORDED_BACKWARD["gpu_key"]
    if target_gpu_key != measured_on:
        raise SystemExit(
            f"--gluon-recorded-backward: the recorded backward was measured on {measured_on}, "
            f"not on {target_gpu_key}; measure it there with python -m attnkit_tools.tune.configs --gluon "
            "--passes backward"
        )
    configs = RECORDED_BACKWARD["configs"]
    note = (
        f"recorded from the {measured_on} measurement made before the tuner measured the backward; "
        "re-measure with python -m attnkit_tools.tune.configs --gluon --passes backward"
    )
    return {
        "backward": {key: cfg.as_dict() for key, cfg in configs.items()},
        "routed": {"backward": dict.fromkeys(configs, RECORDED_BACKWARD["routed_from"])},
        "provenance": {"source": note, "measured": RECORDED_BACKWARD["measured"]},
    }


def chosen_as_routed(
    candidate_ms: Mapping[str, Mapping[int, float]], plain_ms: Mapping[int, float]
) -> tuple[str, int | None]:
    """The candidate to keep for a pass and the N its launcher beats the plain one's from
    (:func:`attnkit_tools.tune.routing.routed_from`), judged
    as the cell would run: the plain kernel below that N, the candidate from there on. The kept
    one has the smallest time-over-best (:func:`attnkit_tools.tune.ranking.time_over_best`) of
    those routed times, so a candidate is not held back by lengths where the plain kernel runs
    instead of it. Ties (none routed, say) go to the candidate closest to the best on its own
    times. ``candidate_ms``: {label: {N: ms}}, every candidate timed at ``plain_ms``'s N."""
    starts = {label: routed_from(ms, plain_ms) for label, ms in candidate_ms.items()}

    def as_it_would_run(label: str) -> dict[int, float]:
        start, ms = starts[label], candidate_ms[label]
        return {n: ms[n] if start is not None and n >= start else plain_ms[n] for n in plain_ms}

    routed_score = time_over_best({label: as_it_would_run(label) for label in candidate_ms})
    own_score = time_over_best({label: {n: ms[n] for n in plain_ms} for label, ms in candidate_ms.items()})
    chosen = min(candidate_ms, key=lambda label: (routed_score[label], own_score[label]))
    return chosen, starts[chosen]


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
        note += f", not measured on {target_gpu_key}: run python -m attnkit_tools.tune.configs --gluon there"
    carried = dict(section)
    carried["provenance"] = {"source": note, "measured": measured}
    if "provenance_of" in section:
        carried["provenance_of"] = {
            name: _carried_provenance(provenance, target_gpu_key)
            for name, provenance in section["provenance_of"].items()
        }
    return carried


def _carried_provenance(provenance: Mapping, target_gpu_key: str) -> dict:
    if "source" in provenance:  # carried over or recorded already: kept as it is
        return dict(provenance)
    measured_on = provenance.get("gpu_key", "?")
    note = f"carried over from the {measured_on} measurement"
    if measured_on != target_gpu_key:
        note += f", not measured on {target_gpu_key}: run python -m attnkit_tools.tune.configs --gluon there"
    return {"source": note, "measured": dict(provenance)}


def write_section(path: str, section: dict) -> None:
    """Set the Gluon section of the table at ``path`` (its Triton families kept as they are)."""
    with _locked(path):
        table = _read(path)
        table[SECTION] = section
        _write(path, table)


def merge_measured(path: str, measured: dict) -> None:
    """Write the cells of ``measured`` (:func:`measure_section` of some cells and passes) into
    the table at ``path``: for each pass measured, its configs, routed N (a cell not routed any
    more is removed) and timings replace the old; the other cells and passes stay, each with
    the provenance it had (``provenance_of`` where it differs from the section's). A
    ``measured`` pass without timings (:func:`recorded_backward`) is written the same way.
    Several processes (one a GPU) may merge into one table: each holds a lock on it while it
    reads and writes."""
    with _locked(path):
        table = _read(path)
        table[SECTION] = merged_section(table.get(SECTION, {}), measured)
        _write(path, table)


def merged_section(section: Mapping, measured: Mapping) -> dict:
    """:func:`merge_measured` on a section in memory."""
    passes = [name for name in PASSES if name in measured]
    provenance_of = {name: _pass_provenance(section, name) for name in PASSES if name in section}
    provenance_of.update(dict.fromkeys(passes, measured["provenance"]))
    merged: dict = {"provenance": None}  # first in the file, as the other writers place it
    merged.update({name: dict(section.get(name, {})) for name in PASSES if name in section or name in passes})
    merged["routed"] = {name: dict(cells) for name, cells in section.get("routed", {}).items()}
    timings = {name: dict(cells) for name, cells in section.get("timings_ms", {}).items() if name in PASSES}
    for key in ("seq_lens", "routing_seq_lens"):
        if key in measured or key in section:
            merged[key] = measured.get(key, section.get(key))
    for name in passes:
        cells = measured.get("timings_ms", {}).get(name, measured[name])
        routed = merged["routed"].setdefault(name, {})
        for key in cells:  # a cell where no candidate passed keeps neither config nor route
            routed.pop(key, None)
            merged[name].pop(key, None)
        routed.update(measured["routed"].get(name, {}))
        merged[name].update(measured[name])
        if name in measured.get("timings_ms", {}):
            timings.setdefault(name, {}).update(measured["timings_ms"][name])
        else:  # recorded without timings: none of an older measurement stays beside it
            for key in cells:
                timings.get(name, {}).pop(key, None)
    if any(timings.values()):
        merged["timings_ms"] = {name: cells for name, cells in timings.items() if cells}
    # The section's provenance is the run that measured all its passes; a run measuring some
    # leaves it, and its passes get their own.
    every_pass = set(passes) >= {name for name in PASSES if name in merged}
    merged["provenance"] = section.get("provenance", measured["provenance"])
    if every_pass:
        merged["provenance"] = measured["provenance"]
    apart = {name: prov for name, prov in provenance_of.items() if prov != merged["provenance"]}
    if apart:
        merged["provenance_of"] = apart
    return merged


def _pass_provenance(section: Mapping, pass_name: str):
    """Where ``section``'s ``pass_name`` was measured: its own provenance, else the section's."""
    return section.get("provenance_of", {}).get(pass_name, section.get("provenance"))


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
    from attnkit.triton.gluon.forward_launch import launch

    return lambda: launch(q, k, v, problem.causal, problem.scale, cfg)


def outside_tolerance_rule(head_dim: int, causal: bool, cfg: HopperForwardConfig) -> str:
    """'' if the Gluon forward with ``cfg`` (and the Triton backward from its log-sum-exp) passes
    attnkit.testing's tolerance rule on a ragged problem, else the failed quantities."""
    from attnkit.triton import TritonImplementation
    from attnkit.triton.gluon.forward_launch import launch

    class GluonForward:
        op_name = None
        triton = TritonImplementation()

        def forward(self, q, k, v, problem):
            return launch(q, k, v, problem.causal, problem.scale, cfg)

        def backward(self, *args):
            return self.triton.backward(*args)

    return _rule_failures(GluonForward(), head_dim, causal, q_heads=2)


def backward_outside_tolerance_rule(head_dim: int, causal: bool, cfg: BackwardConfig) -> str:
    """'' if the Gluon backward with ``cfg`` (after the plain Triton forward) passes
    attnkit.testing's tolerance rule on a ragged problem with grouped heads, else the failed
    quantities."""
    from attnkit.triton import TritonImplementation
    from attnkit.triton.gluon.backward_launch import launch

    class GluonBackward:
        op_name = None
        triton = TritonImplementation()

        def forward(self, q, k, v, problem):
            return self.triton.forward(q, k, v, problem)

        def backward(self, grad_out, q, k, v, out, lse, problem):
            return launch(q, k, v, out, grad_out.contiguous(), lse, problem, cfg)

    return _rule_failures(GluonBackward(), head_dim, causal, q_heads=4)


def _rule_failures(implementation, head_dim: int, causal: bool, q_heads: int) -> str:
    """The quantities in which ``implementation`` (a flash_attention path) fails the tolerance
    rule on a ragged bf16 problem (N = 300, M = 333, 2 kv heads), '' when none does."""
    from attnkit.flash_autograd import flash_attention
    from attnkit.inputs import check_inputs
    from attnkit.testing import compare_to_reference, make_tensor

    gen = torch.Generator().manual_seed(0)
    kw = {"dtype": torch.bfloat16, "device": "cuda", "generator": gen}
    q = make_tensor((1, q_heads, 300, head_dim), **kw)
    k, v = (make_tensor((1, 2, 333, head_dim), **kw) for _ in range(2))
    grad_out = torch.randn(q.shape, generator=gen).to(q)

    def run(a, b, c):
        return flash_attention(implementation, a, b, c, check_inputs(a, b, c, causal, None))

    checks = compare_to_reference(run, q, k, v, causal=causal, scale=None, grad_out=grad_out)
    return "; ".join(c.describe() for c in checks if not c.ok)


def candidate(pass_name: str, label: str):
    """The config of candidate ``label`` of ``pass_name``."""
    return (FORWARD_CANDIDATES if pass_name == "forward" else BACKWARD_CANDIDATES)[label]


def candidate_jobs(cells, passes) -> list[tuple[str, int, bool, str]]:
    """(pass, head dim, causal, candidate) of every candidate a run checks and times."""
    jobs = []
    for pass_name in passes:
        for d, causal in cells:
            labels = list(FORWARD_CANDIDATES) if pass_name == "forward" else backward_candidates(causal)
            jobs += [(pass_name, d, causal, label) for label in labels]
    return jobs


def _check(job: tuple[str, int, bool, str]) -> str:
    """In a worker process: compile one candidate of one pass and cell and check it against the
    oracle. '' when usable, else 'failed: ...' or 'wrong: ...'."""
    pass_name, head_dim, causal, label = job
    rule = outside_tolerance_rule if pass_name == "forward" else backward_outside_tolerance_rule
    try:
        wrong = rule(head_dim, causal, candidate(pass_name, label))
        if not wrong:
            _warm_up(pass_name, head_dim, causal, label)
    except Exception as error:  # does not compile, or out of resources
        return f"failed: {type(error).__name__}: {str(error)[:200]}"
    return f"wrong: {wrong}" if wrong else ""


def _warm_up(pass_name: str, head_dim: int, causal: bool, label: str) -> None:
    """Run the candidate once on a problem specialized as the timed ones are (lengths, heads and
    B * H multiples of 16, one query head a key head), so that Triton's on-disk cache holds the
    binaries the timing loads: the check's ragged lengths compile other specializations. The
    first backward candidate of a cell also warms the plain forward and backward."""
    from attnkit.inputs import check_inputs
    from attnkit.triton.launch import attention_backward, attention_forward, launch_setup

    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, 2048 // head_dim, 1024, head_dim)
    q, k, v, do = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    problem = check_inputs(q, k, v, causal, None)
    if pass_name == "forward":
        _gluon_run(q, k, v, problem, FORWARD_CANDIDATES[label])()
    else:
        from attnkit.triton.gluon.backward_launch import launch

        setup = launch_setup(problem)
        out, lse = attention_forward(q, k, v, setup)
        launch(q, k, v, out, do, lse, problem, BACKWARD_CANDIDATES[label])
        if label == backward_candidates(causal)[0]:
            attention_backward(do, q, k, v, out, lse, setup)
    torch.cuda.synchronize()


def check_all(jobs: list[tuple[str, int, bool, str]], workers: int) -> dict:
    """{job: '' or why not} for every (pass, head dim, causal, candidate) job, compiled and
    checked by ``workers`` processes (here when ``workers`` <= 1); Triton's on-disk cache then
    holds the binaries the timing runs."""
    if workers <= 1:
        return {job: _check(job) for job in jobs}
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
        return dict(zip(jobs, pool.map(_check, jobs, chunksize=1), strict=True))


def measure_section(
    seq_lens, log, table_path: str, cells=None, budget_s: float = 0.05, workers: int = 1, passes=PASSES
) -> dict:
    """The Gluon section of ``cells`` ((head dim, causal) pairs; default :data:`CELLS`) and
    ``passes`` measured on the current CUDA GPU (module docstring); candidates are compiled
    and checked by ``workers`` processes first, then timed here one at a time, then routed
    through the public call (:func:`attnkit_tools.tune.routing.measure_routing`) with the Triton
    families of the table at ``table_path``."""
    from attnkit.triton.gluon import unavailable_reason
    from attnkit_perf.bench import provenance

    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"tune --gluon: the Gluon kernels cannot run here: {reason}")
    device = torch.device("cuda")
    cells = CELLS if cells is None else cells
    section = {"provenance": provenance(device), "routed": {}, "timings_ms": {}}
    verdicts = check_all(candidate_jobs(cells, passes), workers)
    log(f"compiled and checked {len(verdicts)} candidates")
    if "forward" in passes:
        section["seq_lens"] = list(seq_lens)
    section["routing_seq_lens"] = list(ROUTING_SEQ_LENS)
    for pass_name in passes:
        if pass_name == "forward":
            measured = _measure_forward(cells, seq_lens, verdicts, log, budget_s)
        else:
            measured = _measure_backward(cells, verdicts, log)
        section[pass_name], section["timings_ms"][pass_name] = measured
    with _locked(table_path):  # another GPU's process may be writing its cells into it
        table = _read(table_path)
    routed, public_call = measure_routing(table, section, ROUTING_SEQ_LENS, log)
    for pass_name in passes:
        section["routed"][pass_name] = routed.get(pass_name, {})
        for key, times in public_call.get(pass_name, {}).items():
            section["timings_ms"][pass_name][key]["public_call"] = times
    return section


def _usable(pass_name, head_dim, causal, labels, verdicts, cell_timings, log) -> list[str]:
    """The candidates that compiled and passed their check; the others' verdicts recorded."""
    key = cell_key(head_dim, causal)
    usable = []
    for label in labels:
        verdict = verdicts[pass_name, head_dim, causal, label]
        cell_timings[label] = verdict or {}
        if verdict:
            log(f"  {pass_name} {key} {label:28s} {verdict[:100]}")
        else:
            usable.append(label)
    if not usable:
        log(f"{pass_name} {key}: no candidate passed; the cell keeps the plain kernel")
    return usable


def _measure_forward(cells, seq_lens, verdicts, log, budget_s):
    from attnkit.triton.launch import attention_forward, launch_setup
    from attnkit_perf.bench import median_time_s
    from attnkit_tools.tune.ranking import tuning_inputs

    device = torch.device("cuda")
    configs, timings = {}, {}
    for head_dim, causal in cells:
        key = cell_key(head_dim, causal)
        cell_timings = timings[key] = {}
        usable = _usable("forward", head_dim, causal, FORWARD_CANDIDATES, verdicts, cell_timings, log)
        if not usable:
            continue
        tuning_plain_ms = {}
        for n in seq_lens:
            q, k, v, _, problem = tuning_inputs(torch.bfloat16, head_dim, causal, n)
            tuning_plain_ms[n] = 1e3 * median_time_s(
                partial(attention_forward, q, k, v, launch_setup(problem)), device, budget_s
            )
            log(f"  {key} {'plain':28s} N={n:<6d} {tuning_plain_ms[n]:.3f} ms")
            for label in usable:
                run = _gluon_run(q, k, v, problem, FORWARD_CANDIDATES[label])
                ms = 1e3 * median_time_s(run, device, budget_s)
                cell_timings[label][str(n)] = round(ms, 4)
                log(f"  {key} {label:28s} N={n:<6d} {ms:.3f} ms")
        chosen, start = chosen_as_routed(
            {label: {n: cell_timings[label][str(n)] for n in seq_lens} for label in usable}, tuning_plain_ms
        )
        cell_timings["plain"] = {str(n): round(t, 4) for n, t in tuning_plain_ms.items()}
        configs[key] = dataclasses.asdict(FORWARD_CANDIDATES[chosen])
        log(
            f"forward {key}: chosen {chosen}"
            + (f" (its launcher beats the plain one from N={start})" if start else "")
        )
    return configs, timings


def _measure_backward(cells, verdicts, log):
    """Each usable backward candidate and the plain backward timed at :data:`ROUTING_SEQ_LENS`
    (do_bench medians); the candidate kept is the one closest to the best as it would be routed
    (:func:`chosen_as_routed`), routed where it beat the plain backward."""
    from triton.testing import do_bench

    from attnkit.triton.gluon.backward_launch import launch
    from attnkit.triton.launch import attention_backward, attention_forward, launch_setup
    from attnkit_tools.tune.ranking import tuning_inputs

    configs, timings = {}, {}
    for head_dim, causal in cells:
        key = cell_key(head_dim, causal)
        cell_timings = timings[key] = {}
        labels = backward_candidates(causal)
        usable = _usable("backward", head_dim, causal, labels, verdicts, cell_timings, log)
        if not usable:
            continue
        plain_ms = {}
        for n in ROUTING_SEQ_LENS:
            q, k, v, do, problem = tuning_inputs(torch.bfloat16, head_dim, causal, n, batch=backward_batch(n))
            setup = launch_setup(problem)
            out, lse = attention_forward(q, k, v, setup)
            plain = partial(attention_backward, do, q, k, v, out, lse, setup)
            plain_ms[n] = do_bench(plain, return_mode="median")
            log(f"  backward {key} plain{'':24s} N={n:<6d} {plain_ms[n]:.3f} ms")
            for label in usable:
                run = partial(launch, q, k, v, out, do, lse, problem, BACKWARD_CANDIDATES[label])
                ms = do_bench(run, return_mode="median")
                cell_timings[label][str(n)] = round(ms, 4)
                log(f"  backward {key} {label:28s} N={n:<6d} {ms:.3f} ms")
            del q, k, v, do, out, lse
        chosen, start = chosen_as_routed(
            {label: {n: cell_timings[label][str(n)] for n in ROUTING_SEQ_LENS} for label in usable}, plain_ms
        )
        configs[key] = BACKWARD_CANDIDATES[chosen].as_dict()
        cell_timings["plain"] = {str(n): round(t, 4) for n, t in plain_ms.items()}
        log(
            f"backward {key}: chosen {chosen}"
            + (f" (its launcher beats the plain one from N={start})" if start else "")
        )
    return configs, timings
