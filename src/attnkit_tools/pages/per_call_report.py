"""The per-call report of :mod:`attnkit_tools.pages.per_call`: targets decided on the paired
comparisons, the console table and the Markdown page (docs/<gpu>/PER_CALL.md). No GPU needed: a saved
report renders again with ``python -m attnkit_tools.pages.per_call --from-json FILE --md PAGE``.

The targets, each decided on the 95% bootstrap interval of a paired median (PASS when the whole
interval meets the target, FAIL when none of it does, UNCLEAR otherwise):

* ``sdpa-X`` costs at most :data:`EXTRA_LIMIT_US` of host time more than raw ``X`` forced;
* ``triton`` costs at most :data:`TRITON_LIMIT_RATIO` times raw SDPA's host time, and its
  forward at the small shapes (:data:`SMALL_SIZES`) at most :data:`TRITON_LIMIT_US`.
"""

from __future__ import annotations

from attnkit_tools.pages.provenance import provenance_table

#: The targets' pairs: attnkit path -> its raw counterpart (the same kernel, forced once outside
#: the loop; PyTorch's choice for ``sdpa`` and ``triton``).
PAIRED = {
    "sdpa": "raw-sdpa",
    "sdpa-flash": "raw-flash",
    "sdpa-efficient": "raw-efficient",
    "sdpa-cudnn": "raw-cudnn",
    "sdpa-math": "raw-math",
    "triton": "raw-sdpa",
}
EXTRA_LIMIT_US = 10.0
TRITON_LIMIT_US, TRITON_LIMIT_RATIO = 40.0, 2.0
#: Where the absolute limit applies to the Triton forward: the shapes whose kernels take less
#: time than a call's host work, so the host cost is what a caller waits for.
SMALL_SIZES = {"B1-H1-N8-D16", "B1-H8-N128-D64", "B8-Hq32-Hkv8-N1-M4096-D128"}


def verdict(low: float, high: float, limit: float) -> str:
    """PASS: the whole interval is within ``limit``; FAIL: none of it is; else UNCLEAR."""
    return "PASS" if high <= limit else "FAIL" if low > limit else "UNCLEAR"


def targets(paired: list[dict]) -> list[str]:
    """One line per A/A control and per target, decided on the paired comparisons (each with
    ``size``, ``pass``, ``path``, ``raw`` and ``path_us``, ``extra_us``, ``ratio`` summaries
    of ``median``, ``low``, ``high``)."""
    lines = []
    for c in paired:
        where = f"[{c['size']} {c['pass']}]"
        extra, ratio = c["extra_us"], c["ratio"]
        if c["path"] == c["raw"]:
            lines.append(
                f"A/A {c['path']} - {c['raw']} host {extra['median']:+.1f} us "
                f"(95% [{extra['low']:+.1f}, {extra['high']:+.1f}]) {where}"
            )
        elif c["path"] == "triton":
            lines.append(
                f"{verdict(ratio['low'], ratio['high'], TRITON_LIMIT_RATIO)} triton / raw-sdpa host "
                f"x{ratio['median']:.2f} (95% [{ratio['low']:.2f}, {ratio['high']:.2f}]) <= "
                f"x{TRITON_LIMIT_RATIO:g} {where}"
            )
            if c["pass"] == "fwd" and c["size"] in SMALL_SIZES:
                alone = c["path_us"]
                lines.append(
                    f"{verdict(alone['low'], alone['high'], TRITON_LIMIT_US)} triton host "
                    f"{alone['median']:.1f} us (95% [{alone['low']:.1f}, {alone['high']:.1f}]) <= "
                    f"{TRITON_LIMIT_US:g} us {where}"
                )
        else:
            lines.append(
                f"{verdict(extra['low'], extra['high'], EXTRA_LIMIT_US)} {c['path']} - {c['raw']} host "
                f"{extra['median']:+.1f} us (95% [{extra['low']:+.1f}, {extra['high']:+.1f}]) <= "
                f"+{EXTRA_LIMIT_US:g} us {where}"
            )
    return lines


def _row_cells(r: dict) -> list[str]:
    if "error" in r:
        return [r["size"], r["pass"], r["path"], f"error: {r['error']}", "", ""]
    return [r["size"], r["pass"], r["path"], *(f"{r[k]:.1f}" for k in ("host_us", "wall_us", "gpu_us"))]


def console_table(rows: list[dict]) -> str:
    """Each path alone, one line a row, for the terminal."""
    lines = [f"{'size':<28} {'pass':<8} {'path':<15} {'host_us':>9} {'wall_us':>9} {'gpu_us':>9}"]
    for r in rows:
        size, pass_name, path, *times = _row_cells(r)
        numbers = " ".join(f"{t:>9}" for t in times) if "error" not in r else times[0]
        lines.append(f"{size:<28} {pass_name:<8} {path:<15} {numbers}")
    return "\n".join(lines)


def markdown(report: dict, command: str) -> str:
    """The report as a page: the command and provenance, the paired comparisons, the targets
    decided again from them (the rule is this module's), then each row's least-of-loops host,
    wall and GPU time. ``report``: what :func:`attnkit_tools.pages.per_call.run` returns."""
    lines = [
        "# Per-call cost against raw SDPA",
        "",
        f"Produced by `{command}` (the module's docstring says how each figure is measured). "
        "bf16, causal; microseconds of host time per call.",
        "",
        *provenance_table(
            {
                **report["provenance"],
                "python": report["python"],
                "triton_direct_launches": report["direct_launches"],
                "compiled_call_memo": report["fast_calls"],
            }
        ),
        "",
        "## Paired, call by call (median, 95% bootstrap interval)",
        "",
        "| size | pass | path | us | raw | raw us | path - raw us | path / raw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in report["paired"]:
        extra, ratio = c["extra_us"], c["ratio"]
        path = "A/A control" if c["path"] == c["raw"] else c["path"]
        lines.append(
            f"| {c['size']} | {c['pass']} | {path} | {c['path_us']['median']:.1f} | {c['raw']} | "
            f"{c['raw_us']['median']:.1f} | "
            f"{extra['median']:+.1f} [{extra['low']:+.1f}, {extra['high']:+.1f}] | "
            f"x{ratio['median']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}] |"
        )
    lines += ["", "## Targets", "", *[f"- {v}" for v in targets(report["paired"])], ""]
    lines += [
        "## Each path alone (least of the loops)",
        "",
        "| size | pass | path | host us | wall us | GPU us |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(_row_cells(r)) + " |" for r in report["rows"]),
    ]
    return "\n".join(lines) + "\n"
