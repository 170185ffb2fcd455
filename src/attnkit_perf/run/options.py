"""The perf gate's configuration, read once per pytest process: which mode, which thresholds,
and the files it compares with (the baseline, the A/A noise). Every way a comparison could
silently not happen is a :class:`pytest.UsageError` here, before any benchmark runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnkit_perf.decide import gate, pooled
from attnkit_perf.decide import out_of_time as out_of_time_
from attnkit_perf.decide.noise import noise_sigmas
from attnkit_perf.formats import spread
from attnkit_perf.formats.baseline import RECORD_COMMAND, baseline_path, load_baseline, missing_message
from attnkit_perf.formats.noise import coverage_notes, host_noise_name, noise_file, noise_protocol, read_noise
from attnkit_perf.formats.schema import FormatError
from attnkit_perf.measure.timing import TIMING_PROTOCOL


def _usage(message: str) -> pytest.UsageError:
    return pytest.UsageError(f"attnkit perf gate: {message}")


def mode(config: pytest.Config, opt: dict) -> str | None:
    """``paired`` (``--attnkit-base``), ``stored`` (``--benchmark-compare``) or None."""
    compare = config.getoption("benchmark_compare", default=None)
    return "paired" if opt["base"] else ("stored" if compare not in (None, [], False) else None)


def thresholds(opt: dict, mode: str | None) -> gate.Thresholds:
    default_slower = gate.Thresholds.slower if mode == "paired" else gate.Thresholds.STORED_SLOWER
    return gate.Thresholds(
        slower=opt["slower"] if opt["slower"] is not None else default_slower,
        run_alpha=opt["run_alpha"],
        memory_rel=opt["memory_rel"],
        memory_abs_bytes=int(opt["memory_abs_mib"] * gate.MIB),
        noise_k=opt["noise_k"],
        fail_on_inconclusive=opt["fail_on_inconclusive"],
        fail_out_of_time=out_of_time(opt.get("out_of_time")) == "fail",
        allow_dropped=opt["allow_dropped"],
        host_slower=_or_default(opt.get("host_slower"), gate.Thresholds.host_slower),
        host_count_slower=_host_count_slower(opt.get("host_count_slower")),
        kept_abs_bytes=int(
            _or_default(opt.get("kept_abs_kib"), gate.Thresholds.kept_abs_bytes / 1024) * 1024
        ),
    )


def _or_default(value, default):
    return default if value is None else value


def _host_count_slower(value: float | None) -> float:
    if value is None:
        return gate.Thresholds.host_count_slower
    if not 0 <= value < 1:
        raise _usage(f"--attnkit-host-count-slower: expected a fraction in [0, 1), got {value}")
    return value


def time_budget(value: str | None, mode: str | None, ini: str | None = None) -> float | None:
    """``--attnkit-time-budget`` (``value``), else the ini key ``attnkit_time_budget`` (``ini``):
    seconds for the paired run (None: no budget; also ``none``). Given outside paired mode, the
    option is a usage error; the ini key, which every run of the project reads, applies to
    paired runs only."""
    if value is None and ini not in (None, "") and mode != "paired":
        return None
    value = ini if value is None else value
    if value is None or str(value).strip().lower() in ("", "none"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise _usage(f"--attnkit-time-budget: expected a number of seconds > 0 or 'none', got {value!r}")
    if mode != "paired":
        raise _usage(
            "--attnkit-time-budget plans paired mode's rows (--attnkit-base=REF); "
            f"this run is {'in ' + mode + ' mode' if mode else 'not comparing'}: drop the option"
        )
    return seconds


def out_of_time(value: str | None) -> str:
    """``--attnkit-out-of-time``: whether rows the time budget left undecided pass the run
    (the default) or fail it."""
    value = "pass" if value in (None, "") else str(value).strip().lower()
    if value not in out_of_time_.CHOICES:
        choices = " or ".join(out_of_time_.CHOICES)
        raise _usage(f"--attnkit-out-of-time: expected {choices}, got {value!r}")
    return value


def check_usage(mode: str | None, device: torch.device, opt: dict) -> None:
    gpu = device.type == "cuda"
    if mode and not gpu and not opt["allow_cpu"]:
        raise _usage(
            f"{mode} mode compares GPU timings, and there is no CUDA device here ({device}). "
            "Without --benchmark-compare / --attnkit-base the perf tests run the CPU smoke benchmarks "
            "without comparing; --attnkit-allow-cpu compares them anyway (to try the gate itself: "
            "a shared CPU moves timings by tens of percent, so give a loose --attnkit-slower and "
            "--attnkit-host-slower)."
        )
    if opt["record"] and not gpu and not opt["allow_cpu"]:
        raise _usage(
            "refusing to record a baseline on the CPU: host timings of the smoke grid are not a gate; "
            "record on the GPU model the gate runs on (--attnkit-allow-cpu records anyway, to try "
            "the gate itself)"
        )
    if opt["record"] and opt["base"]:
        raise _usage("--attnkit-record and --attnkit-base exclude each other")


def record_command(config: pytest.Config) -> str:
    """The command that records the baseline of this run's grid: the installed tests' (with the
    backends named) when they were collected with --pyargs, else this repository's."""
    if not config.getoption("pyargs", default=False):
        return RECORD_COMMAND
    named = [f"--attnkit-backend {name}" for name in config.getoption("attnkit_backend", default=None) or []]
    return " ".join(["pytest --pyargs attnkit_perf.suite", *named, "--attnkit-record"])


def stored_baseline(config: pytest.Config, root: Path, key: str, opt: dict) -> tuple[dict, Path]:
    """The baseline stored mode compares with, validated, and its path."""
    compare = config.getoption("benchmark_compare")
    if compare is True:
        path = baseline_path(root, key)
        if not path.exists():
            raise _usage(missing_message(root, key, record_command(config)))
    else:
        path = Path(str(compare))
        if not path.is_file():
            raise _usage(
                f"--benchmark-compare={compare}: no such baseline file (give the path of a baseline "
                f"JSON, or no value for {baseline_path(root, key)})"
            )
    try:
        baseline = load_baseline(path, key, opt["allow_other_gpu"], timing_protocol=TIMING_PROTOCOL)
    except FormatError as err:
        raise _usage(f"{err}; re-record it with: {record_command(config)}") from err
    # pytest-benchmark's own --benchmark-compare-fail then reads the same file.
    config.option.benchmark_compare = str(path.resolve())
    return baseline, path


def noise(
    opt: dict, root: Path, key: str, mode: str, baseline: dict | None = None
) -> tuple[dict[str, float], list[str], tuple | None]:
    """``({benchmark: log-ratio sigma bound}, notes, (path, timing protocol) or None)`` from the
    A/A noise file, if any; in stored mode from the pooled ``baseline``'s spread
    (:mod:`attnkit_perf.decide.pooled`) when the file is one."""
    path = opt["noise"] or noise_file(root, key, mode)
    if mode == "stored" and str(path) != "none":
        if not opt["noise"] and not Path(path).is_file():
            return {}, [spread.missing_note(path)], None
        try:
            if spread.is_spread(path):
                document = spread.read_spread(path, key, TIMING_PROTOCOL)
                return (*pooled.spread_bounds(document, path, baseline), None)
        except FormatError as err:
            raise _usage(str(err)) from err
    if str(path) == "none" or (not opt["noise"] and not Path(path).is_file()):
        return {}, [f"no A/A noise file ({path}): every benchmark held to the practical threshold"], None
    try:
        document = read_noise(path, key, mode, timing_protocol=TIMING_PROTOCOL)
        sds, protocol = noise_sigmas(document), noise_protocol(document)
    except FormatError as err:
        raise _usage(str(err)) from err
    return sds, [f"A/A noise from {path}: {len(sds)} benchmarks"], (path, protocol)


def noise_coverage(
    source: tuple, noise: dict, gpu_grid: list, cpu_grid: list, names, mode, device
) -> list[str]:
    """The notes on how the A/A noise file ``source`` (``(path, timing protocol)``) covers the
    grid's cases (:class:`attnkit_perf.measure.cases.BenchCase`) and this run's ``names``; the
    host metric's noise is held under names of its own (:func:`host_noise_name`), for the cases
    paired mode times it on (every case on the CPU)."""
    path, protocol = source
    hosted = {c.name for c in gpu_grid if c.host_timed} | {c.name for c in cpu_grid}
    grid = [c.name for c in gpu_grid + cpu_grid] + [host_noise_name(n) for n in hosted]
    timed = [host_noise_name(n) for n in names if mode == "paired" and (n in hosted or device.type != "cuda")]
    return coverage_notes(path, noise, grid, [*names, *timed], protocol)
