"""Paired mode's identity check: the GPU work of one call on each side, compared launch by launch
(attnkit_perf.measure.fingerprint, attnkit_perf.decide.identity)."""

from __future__ import annotations

import copy
import gc
import hashlib
from types import SimpleNamespace

import torch
from triton.runtime.jit import JITFunction

from attnkit_perf.decide.identity import compare_fingerprints, identity_decision
from attnkit_perf.measure.fingerprint import compiled_binaries, gpu_work, launch_fingerprint, launched_shapes

TRACE = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 1},
    {"ph": "X", "cat": "kernel", "name": "_plain_fwd_kernel", "ts": 30,
     "args": {"grid": [32, 1, 1], "block": [128, 1, 1], "shared memory": 65536,
              "registers per thread": 168, "stream": 7, "correlation": 99}},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 10,
     "args": {"bytes": 4096, "stream": 7}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": 20},
]  # fmt: skip


def fingerprint(trace=TRACE, binaries=None):
    return {"launches": gpu_work(trace), "binaries": binaries or {"_plain_fwd_kernel": ["aaaa"]}}


def test_the_gpu_work_is_every_kernel_copy_and_fill_in_the_order_they_started():
    work = gpu_work(TRACE)
    assert work == [
        ["gpu_memset", "Memset (Device)", {"bytes": 4096}],
        ["kernel", "_plain_fwd_kernel", {"grid": [32, 1, 1], "block": [128, 1, 1], "shared memory": 65536,
                                         "registers per thread": 168}],
    ]  # fmt: skip


def test_the_same_launches_of_the_same_binaries_are_identical_and_decide_same_untimed():
    identity = compare_fingerprints(fingerprint(), copy.deepcopy(fingerprint()))
    assert identity.identical and identity.launches == 2
    decision = identity_decision(identity)
    assert decision.outcome == "same" and decision.ratio is None and "not timed" in decision.reason


def test_another_grid_another_binary_or_one_more_kernel_differs_and_names_the_difference():
    other_grid = copy.deepcopy(TRACE)
    other_grid[1]["args"]["grid"] = [64, 1, 1]
    identity = compare_fingerprints(fingerprint(), fingerprint(other_grid))
    assert identity.outcome == "differs" and "launch 2" in identity.reason and "[64, 1, 1]" in identity.reason

    identity = compare_fingerprints(fingerprint(), fingerprint(binaries={"_plain_fwd_kernel": ["bbbb"]}))
    assert identity.outcome == "differs" and "_plain_fwd_kernel" in identity.reason

    zeroed = [*TRACE, {"cat": "kernel", "name": "fill_kernel", "ts": 40, "args": {"grid": [8, 1, 1]}}]
    identity = compare_fingerprints(fingerprint(), fingerprint(zeroed))
    assert (
        identity.outcome == "differs"
        and "2 -> 3 launches" in identity.reason
        and "fill_kernel" in identity.reason
    )

    bigger_copy = copy.deepcopy(TRACE)
    bigger_copy[2]["args"]["bytes"] = 8192
    assert compare_fingerprints(fingerprint(), fingerprint(bigger_copy)).outcome == "differs"


def test_a_missing_fingerprint_is_unknown_so_the_row_is_timed():
    identity = compare_fingerprints(None, fingerprint())
    assert identity.outcome == "unknown" and "base" in identity.reason
    assert not compare_fingerprints(fingerprint(), None).identical


def test_no_fingerprint_is_taken_off_a_gpu():
    assert launch_fingerprint(lambda: torch.ones(3), torch.device("cpu")) is None


def test_binaries_are_named_only_for_the_kernels_asked_about():
    assert compiled_binaries({"no_such_kernel_anywhere": {(32, 0)}}) == {}


class _FakeJIT(JITFunction):
    """A JITFunction's caches without a function: what compiled_binaries reads."""

    def __init__(self, *compiled):
        self.device_caches = {0: ({i: c for i, c in enumerate(compiled)},)}


def _compiled(name, code, regs, shared):
    return SimpleNamespace(name=name, kernel=code, n_regs=regs, metadata=SimpleNamespace(shared=shared))


def _digest(code):
    return hashlib.sha256(code).hexdigest()[:16]


def test_only_the_binaries_the_call_launched_are_named_not_other_rows_specialisations():
    launched = launched_shapes(gpu_work(TRACE))  # _plain_fwd_kernel: 168 registers, 65536 B shared
    assert launched == {"_plain_fwd_kernel": {(168, 65536)}}
    name = "_plain_fwd_kernel"
    this_row = _compiled(name, b"this row's code", 168, 65536)
    other_row = _compiled(name, b"another row's code", 96, 32768)
    base_process, head_process = _FakeJIT(this_row), _FakeJIT(this_row, other_row)  # noqa: F841
    named = compiled_binaries(launched)
    # Both processes' JITFunctions are alive here: the other row's binary is held, not named.
    assert named[name] == [_digest(b"this row's code")]


def test_a_launch_that_matches_no_binary_names_every_binary_of_its_kernel():
    name = "_plain_fwd_kernel_unmatched"
    held = _FakeJIT(_compiled(name, b"code a", 168, 65536), _compiled(name, b"code b", 96, 0))  # noqa: F841
    named = compiled_binaries({name: {(168, 65536), (40, 1024)}})
    assert named[name] == sorted([_digest(b"code a"), _digest(b"code b")])


def test_a_changed_binary_with_the_same_launch_shape_still_differs():
    name = "_plain_fwd_kernel_changed"
    launched = {name: {(168, 65536)}}
    base = _FakeJIT(_compiled(name, b"base code", 168, 65536))
    base_binaries = compiled_binaries(launched)
    del base
    gc.collect()
    head = _FakeJIT(_compiled(name, b"head code", 168, 65536))  # noqa: F841
    head_binaries = compiled_binaries(launched)
    identity = compare_fingerprints(
        {"launches": gpu_work(TRACE), "binaries": base_binaries},
        {"launches": gpu_work(TRACE), "binaries": head_binaries},
    )
    assert identity.outcome == "differs" and name in identity.reason, identity.reason


_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def double(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n) * FACTOR, mask=i < n)
"""

#: Compiles the kernel module at argv[1] for sm_90 without a GPU, its cubin to argv[2].
_COMPILE = """
import importlib.util, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("kernel", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
signature = {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"}
source = ASTSource(fn=module.double, signature=signature, constexprs={"BLOCK": 128})
with open(sys.argv[2], "wb") as out:
    out.write(triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"])
"""


def _cubin(folder, factor: int) -> bytes:
    """The sm_90 cubin of :data:`_KERNEL` written in ``folder``, compiled without a GPU in a
    process of its own: compiled (not interpreted, whatever ``TRITON_INTERPRET`` says here: the
    interpreter patches Triton's language for the whole process), with a Triton cache of its own
    (Triton's cache key holds the source, not its path)."""
    import os
    import subprocess
    import sys

    folder.mkdir()
    (folder / "kernel.py").write_text(_KERNEL.replace("FACTOR", str(factor)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(folder / "cache")
    args = [sys.executable, "-c", _COMPILE, str(folder / "kernel.py"), str(folder / "kernel.cubin")]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return (folder / "kernel.cubin").read_bytes()


def test_the_same_code_compiled_from_two_checkouts_has_one_digest_and_other_code_another(tmp_path):
    """The base and the head are two folders: Triton's line table names the file's path, so the
    cubins differ byte for byte; their machine code does not, and the digest is the code's."""
    from attnkit_perf.measure.fingerprint import machine_code_digest

    base, head = _cubin(tmp_path / "base", 2), _cubin(tmp_path / "head", 2)
    changed = _cubin(tmp_path / "changed", 3)
    assert base != head and str(tmp_path / "base").encode() in base, "the path is in the line table"
    assert machine_code_digest(base) == machine_code_digest(head)
    assert machine_code_digest(changed) != machine_code_digest(base)
    assert machine_code_digest(b"not an ELF") == _digest(b"not an ELF")


# --- in paired mode's procedure -------------------------------------------------------------------


def _rule():
    from attnkit_perf.decide.gate import Thresholds
    from attnkit_perf.decide.paired_rule import PairedRule

    return PairedRule(Thresholds(), alpha=0.001, threshold=0.02)


class OneLookSession:
    """A paired session whose looks read the given fingerprints, and blocks when the loop asks
    for pairs (only where the rule did not find the same GPU work on both sides)."""

    def __init__(self, base_fingerprint, head_fingerprint, peaks=(1000, 1000)):
        self.fingerprints = {"base": base_fingerprint, "head": head_fingerprint}
        self.peaks = dict(zip(("base", "head"), peaks, strict=True))
        self.restarts, self.timed, self.counted, self.walled = 0, False, False, False

    def prepare(self, case, fingerprint=False):
        from attnkit_perf.measure.paired_session import PreparedCase, SideResult

        results = {
            side: SideResult(
                fingerprint=self.fingerprints[side] if fingerprint else None, peak_bytes=self.peaks[side]
            )
            for side in ("base", "head")
        }
        return PreparedCase(case, results, reps=1)

    def prepare_others(self, prepared):
        prepared.everyone = True

    def measure_pairs(self, prepared, pairs, rounds):
        self.timed = True
        for result in prepared.results.values():
            result.blocks, result.workers = [1.0, 1.3] * (pairs // 2), list(range(pairs))

    def count_host(self, prepared):
        self.counted = True

    def time_host(self, prepared, settings):
        self.walled = True
        for result in prepared.results.values():
            result.host_per_call = [1e-5] * 4

    def release(self):
        pass

    def restart(self):
        self.restarts += 1


def _measure(paired, host=False, time_all=False):
    from attnkit_perf.measure.paired_session import PairedSettings
    from attnkit_perf.run.paired_benchmark import measure_looks

    results, _ = measure_looks(paired, _rule(), {}, PairedSettings(time_all=time_all), host=host)
    return results


def test_a_row_with_the_same_gpu_work_is_same_without_a_block_timed_or_a_fresh_process():
    paired = OneLookSession(fingerprint(), copy.deepcopy(fingerprint()))
    results = _measure(paired)
    decision = _rule().decide(results)
    assert decision.outcome == "same" and "not timed" in decision.reason
    assert not paired.timed and paired.restarts == 0 and results["head"].blocks == []


def test_the_same_gpu_work_with_more_memory_still_fails_on_memory():
    paired = OneLookSession(fingerprint(), fingerprint(), peaks=(1000, 50 * 2**20))
    results = _measure(paired)
    decision = _rule().decide(results)
    assert not paired.timed, "the same GPU work is not timed, whatever its memory"
    assert decision.outcome == "more-memory" and decision.extra["time_outcome"] == "same"


def test_other_gpu_work_is_timed_as_before():
    other = fingerprint(binaries={"_plain_fwd_kernel": ["bbbb"]})
    paired = OneLookSession(fingerprint(), other)
    results = _measure(paired)
    assert paired.timed and results["head"].blocks
    assert "not timed" not in _rule().decide(results).reason


def test_a_timed_row_says_which_launch_differed():
    other = fingerprint(binaries={"_plain_fwd_kernel": ["bbbb"]})
    results = _measure(OneLookSession(fingerprint(), other))
    assert "_plain_fwd_kernel" in _rule().decide(results).extra["identity"]


def test_an_aa_noise_run_times_every_row_and_its_host_metric_even_with_the_same_work():
    """A/A noise runs (--attnkit-time-all) need a ratio of every row: no fingerprint is taken
    and no host work counted, so neither can decide a row untimed."""
    paired = OneLookSession(fingerprint(), copy.deepcopy(fingerprint()))
    results = _measure(paired, host=True, time_all=True)
    assert paired.timed and results["head"].blocks and results["base"].fingerprint is None
    assert not paired.counted and paired.walled and results["head"].host_per_call
    decision = _rule().decide(results)
    assert decision.ratio is not None and "not timed" not in decision.reason
    usual = OneLookSession(fingerprint(), copy.deepcopy(fingerprint()))
    _measure(usual, host=True)
    assert not usual.timed and usual.counted, "without it the same work is decided untimed"
