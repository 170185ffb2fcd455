"""The GPU gate's correctness tiers (docs/TESTING.md, "Tiers"), read from the markers as pytest
collects them: the PR tier keeps what only a GPU can show and leaves out what the CPU CI decides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PR_TIER = "not device_independent and not nightly"


def _collected(marks: str) -> set[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/correctness",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-m",
            marks,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


@pytest.fixture(scope="module")
def pr_tier() -> set[str]:
    return _collected(PR_TIER)


def test_no_test_marked_for_a_gpu_is_left_to_the_cpu():
    both = _collected("device_independent and (gpu or nightly)")
    assert not both, f"device_independent and also a GPU test: {sorted(both)[:5]}"


@pytest.mark.parametrize(
    "kept",
    [
        "test_compile.py::test_cuda_graph_capture_and_replay[triton-square]",
        "test_compile.py::test_compile_reduce_overhead[flex]",
        "test_gluon_backward.py::test_gradients_pass_the_tolerance_rule[64-full-bf16-mha-dkdv+dq]",
        "test_gluon_forward.py::test_lse_is_natural_log_with_inf_for_rows_that_see_nothing",
        "test_memory.py::test_peak_memory_growth_on_gpu[tiled]",
        "test_fast_launch.py::test_direct_path_is_active_on_this_gpu",
        "test_split_causal.py::test_cudnn_n_below_m_causal_builds_no_mask",
        "test_suite.py::test_backend_matches_reference[sdpa-efficient]",
        # a property declared per device: cuBLAS picks its kernel by batch size
        "test_suite.py::test_a_sequence_gives_the_same_result_alone_and_inside_a_batch[naive]",
        "test_decode.py::test_split_kv_long_cache_default_config[1-paged]",
        # launches nothing, but the CPU CI interprets the kernels and so skips it
        "test_gluon_forward.py::test_compiles_for_sm90_to_what_it_is_meant_to_be[64-full-grid]",
        "test_gluon_backward.py::test_compiles_for_sm90_to_wgmma_and_tma[128-causal-dq]",
    ],
)
def test_the_pr_tier_keeps_the_cuda_only_behaviour(pr_tier, kept):
    assert f"tests/correctness/{kept}" in pr_tier


@pytest.mark.parametrize(
    "left",
    [
        ("test_plugins.py::",),  # registry and entry points
        ("test_errors.py::test_bad_input_raises_named_error_before_any_compute",),
        ("test_rule_power.py::test_rule_rejects_mutant",),
        ("test_suite.py::test_edge_case_matches_reference[naive-",),  # an ATen reference path: nightly
        ("test_suite.py::test_backend_matches_reference[sdpa-math]",),
        # the second dtype of a compiled kernel's grid: nightly
        ("test_gluon_backward.py::test_gradients_pass_the_tolerance_rule[", "-fp16-"),
        ("test_gluon_forward.py::test_matches_the_oracle_with_the_triton_backward[", "torch.float16"),
    ],
    ids=str,
)
def test_the_pr_tier_leaves_out_what_the_cpu_ci_or_the_nightly_run_decides(pr_tier, left):
    kept = [test for test in pr_tier if all(part in test for part in left)]
    assert not kept, f"the PR tier runs {kept[:3]}"


@pytest.mark.parametrize("required", [False, True], ids=["skips", "required"])
def test_a_device_independent_test_that_skips_fails_where_the_cpu_ci_requires_them(required):
    """The GPU gate leaves ``device_independent`` tests to the CPU CI, which sets
    ATTNKIT_REQUIRE_DEVICE_INDEPENDENT=1: there a skip of one is a failure, elsewhere a skip."""
    import os

    env = {**os.environ, "ATTNKIT_FAST_CALLS": "off"}  # the memo parity tests skip without the build
    env.pop("ATTNKIT_REQUIRE_DEVICE_INDEPENDENT", None)
    if required:
        env["ATTNKIT_REQUIRE_DEVICE_INDEPENDENT"] = "1"
    test = "tests/correctness/test_fastpath_parity.py::test_tensor_subclasses_are_the_one_difference_in_keys"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if required:
        assert done.returncode == 1, done.stdout[-2000:]
        assert "is device_independent, which the GPU gate leaves to this run, and it skipped" in done.stdout
    else:
        assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout[-2000:]
