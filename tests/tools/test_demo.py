"""``attnkit-demo`` prints the problem it ran and throughput in a unit that fits it; a backend
it cannot run, when named, ends it with the whole reason and a non-zero status."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import attnkit
from attnkit.reference import reference_attention
from attnkit_perf.measure.cases import DTYPES
from attnkit_tools.demo import DTYPE_NAMES, format_rate, main

#: A reason longer than any cut a message might get, with its fix at the very end.
LONG_REASON = "this kernel needs a device of compute capability 9.0 or newer " * 3 + "(fix: use another one)"


@pytest.mark.parametrize(
    ("flop_per_s", "expected"),
    [(4.16e9, "4.16 GFLOP/s"), (889e6, "889 MFLOP/s"), (1.234e12, "1.23 TFLOP/s"), (0.5, "0.5 FLOP/s")],
)
def test_throughput_is_printed_in_a_unit_that_keeps_three_digits(flop_per_s, expected):
    assert format_rate(flop_per_s) == expected, (
        f"{flop_per_s:g} FLOP/s printed as {format_rate(flop_per_s)!r}"
    )


def test_the_demo_prints_its_problem_and_each_paths_result(capsys):
    status = main(
        ["--seq-len", "32", "--head-dim", "16", "--heads", "2", "--dtype", "fp32", "--device", "cpu",
         "--backends", "naive", "tiled", "--reps", "1"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "problem: B=1 Hq=2 Hkv=2 N=M=32 D=Dv=16 fp32 no mask, forward+backward" in printed, printed
    for name in ("naive", "tiled"):
        row = next((line for line in printed.splitlines() if line.startswith(name)), None)
        assert row is not None, f"no row for {name} in:\n{printed}"
        assert re.search(r"\d[\d.]* [kMGTP]?FLOP/s", row), f"{name}: no throughput with a unit in {row!r}"
        assert "ok (worst" in row, f"{name}: not within the tolerance rule: {row!r}"
    assert "0.0 TFLOP/s" not in printed, printed


def test_help_is_plain_text_with_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    printed = capsys.readouterr().out
    assert "``" not in printed and "::" not in printed, printed
    for default in ("(default: 512)", "(default: bf16)", "(default: 5)"):
        assert default in printed, f"{default} missing from:\n{printed}"


def test_on_the_cpu_it_says_why_peak_memory_is_blank_and_warns_of_interpreted_paths(capsys, monkeypatch):
    import attnkit.registry

    monkeypatch.setattr(
        attnkit.registry, "auto_skip_reason", lambda name, device: "interpreted" if name == "tiled" else None
    )
    status = main(
        ["--seq-len", "16", "--head-dim", "8", "--heads", "1", "--dtype", "fp32", "--device", "cpu",
         "--backends", "naive", "tiled", "--reps", "1", "--no-check"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "warning: tiled runs through Triton's interpreter" in printed, printed
    assert "warning: naive" not in printed, printed
    assert "peak MiB: '-' on cpu: extra memory is read from CUDA's allocator statistics only" in printed, (
        printed
    )


def test_the_dtype_choices_are_the_benchmark_cases_element_types():
    assert set(DTYPE_NAMES) == set(DTYPES), (DTYPE_NAMES, tuple(DTYPES))


def test_help_imports_neither_torch_nor_attnkit():
    """--help and usage errors come before the heavy imports: they print at once."""
    code = (
        "import sys\nfrom attnkit_tools.demo import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        "print('imported:', sorted(m for m in ('torch', 'attnkit') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "imported: []", done.stdout[-2000:]


_SMALL = ["--seq-len", "16", "--head-dim", "8", "--heads", "1", "--dtype", "fp32", "--device", "cpu",
          "--reps", "1", "--no-check"]  # fmt: skip


def _kernel(q, k, v, *, causal, scale, window):
    return reference_attention(q, k, v, causal=causal, scale=scale, window=window).to(q.dtype)


@pytest.fixture
def toy_backend():
    """``toy_backend(**traits)``: registers backend ``demo-toy`` with those traits, removed after."""
    registered = []

    def register(**traits):
        attnkit.register_backend("demo-toy", _kernel, **traits)
        registered.append("demo-toy")

    yield register
    for name in registered:
        attnkit.unregister_backend(name)


def test_an_unknown_backend_is_a_usage_error_listing_every_valid_name(capsys):
    with pytest.raises(SystemExit) as exited:
        main([*_SMALL, "--backends", "naive", "nope"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2, (out, err)
    assert out == "", f"something ran before the usage error:\n{out}"
    assert err.startswith("usage: attnkit-demo"), err
    message = err.splitlines()[-1]
    assert message.startswith("attnkit-demo: error: argument --backends:") and "got 'nope'" in message, err
    for name in ("auto", *attnkit.backend_names()):
        assert f"'{name}'" in message, f"{name!r} missing from the valid names in: {message}"


def test_a_named_backend_unavailable_on_the_device_is_a_usage_error_with_the_whole_reason(
    capsys, toy_backend
):
    toy_backend(device_support=lambda device: LONG_REASON)
    with pytest.raises(SystemExit) as exited:
        main([*_SMALL, "--backends", "demo-toy"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2, (out, err)
    assert out == "", f"something ran before the usage error:\n{out}"
    assert (
        err.splitlines()[-1]
        == f"attnkit-demo: error: argument --backends: demo-toy cannot run on cpu: {LONG_REASON}"
    )


def test_a_named_backend_forward_only_on_the_device_is_a_usage_error(capsys, toy_backend):
    """The demo times forward and backward: a path with no backward there cannot be shown."""
    toy_backend(forward_only=("cpu",))
    with pytest.raises(SystemExit) as exited:
        main([*_SMALL, "--backends", "demo-toy"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "", (out, err)
    assert err.splitlines()[-1].endswith("demo-toy cannot run on cpu: it is forward-only on the cpu, and the "
                                         "demo times forward and backward"), err  # fmt: skip


def test_a_named_backend_both_unavailable_and_forward_only_gets_both_reasons_at_once(capsys, toy_backend):
    """A user who follows the first reason's hint is not met by a second refusal."""
    toy_backend(device_support=lambda device: LONG_REASON, forward_only=("cpu",))
    with pytest.raises(SystemExit) as exited:
        main([*_SMALL, "--backends", "demo-toy"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "", (out, err)
    assert err.splitlines()[-1] == (
        f"attnkit-demo: error: argument --backends: demo-toy cannot run on cpu: {LONG_REASON}; and it is "
        "forward-only on the cpu, and the demo times forward and backward"
    ), err


def test_a_named_backend_declining_the_problem_is_a_skip_with_the_whole_reason_and_status_1(
    capsys, toy_backend
):
    toy_backend(supports=lambda problem: LONG_REASON)
    status = main([*_SMALL, "--backends", "naive", "demo-toy"])
    printed = capsys.readouterr().out
    assert status == 1, printed
    skipped = next((line for line in printed.splitlines() if line.startswith("demo-toy")), "")
    assert "skipped:" in skipped and skipped.endswith(LONG_REASON), printed
    assert re.search(r"^naive .*FLOP/s", printed, re.MULTILINE), f"naive did not run:\n{printed}"
    assert "not run although named with --backends: demo-toy" in printed, printed


def test_a_backend_declining_the_problem_unasked_is_a_skip_and_status_0(capsys, toy_backend, monkeypatch):
    toy_backend(supports=lambda problem: LONG_REASON)
    monkeypatch.setattr(attnkit, "available_backends", lambda device: ["naive", "demo-toy"])
    status = main(_SMALL)
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert any(line.startswith("demo-toy") and line.endswith(LONG_REASON) for line in printed.splitlines()), (
        printed
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq-len", "0"], "argument --seq-len: expected an int >= 1, got 0"),
        (["--batch", "-2"], "argument --batch: expected an int >= 1, got -2"),
        (["--head-dim", "x"], "argument --head-dim: expected an int >= 1, got 'x'"),
        (["--heads", "4", "--kv-heads", "3"], "argument --kv-heads: expected a divisor of --heads 4"),
    ],
)
def test_a_size_the_demo_cannot_run_is_a_usage_error_naming_its_argument(capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        main([*_SMALL, *args])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "", (out, err)
    assert message in err.splitlines()[-1], err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_a_device_this_machine_lacks_is_a_usage_error_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exited:
        main([*_SMALL, "--device", "cuda"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "", (out, err)
    assert err.splitlines()[-1].startswith(
        "attnkit-demo: error: argument --device: cuda cannot be used here:"
    ), err


def test_auto_named_with_backends_runs_beside_the_others(capsys):
    status = main([*_SMALL, "--backends", "auto", "naive"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert re.search(r"^auto .*FLOP/s", printed, re.MULTILINE), printed
