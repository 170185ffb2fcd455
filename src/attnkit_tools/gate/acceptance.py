"""The GPU acceptance run's summary (``bash .ci/gpu-acceptance.sh OUT``): for each step's folder,
what the gate decided, every false alarm, and the step's verdict, read from the files the step
wrote (the gate's ``correctness.xml`` and ``verdict.json``, the step's ``status`` and ``times``).

A step is one of:

* ``aa`` / ``aa-all``: the whole gate on unchanged code against a copy of itself. Every failed
  correctness test and every perf row whose outcome fails a pull request is a false alarm. The
  undecided rows are listed apart, each with its reason and their count: ``inconclusive`` (measured
  to its budget and still unclear, which the gate's rule never fails) and the rows the time budget
  left undecided (``unfinished``, ``not-reached``). They raise no alarm and are no evidence of
  quiet either. The step passes when the gate passed with no false alarm.
* ``stored``: stored mode on unchanged code, read the same way (``new`` and ``missing`` are
  false alarms: the baseline must cover the grid).
* ``change-NAME``: the gate on a planted change. It passes when the gate failed on a row the
  change's cases name (``# cases:`` of its patch), as ``slower`` or ``more-memory``.

    python -m attnkit_tools.gate.acceptance OUT STEP_FOLDER...   (writes OUT/summary.md, prints it)

A step run as shards on several runners (``ATTNKIT_SHARD=I/N bash .ci/gpu-acceptance.sh ...`` on
each) is judged whole: name every shard's folder of it (they share the step's name) and they are
joined into ``OUT/<step>-merged/`` (the verdicts merged by :mod:`attnkit_perf.decide.merge`, the
correctness tests of all, the worst exit status, the longest wall time) before the summary. One
shard's folder alone is summarised with a note that it covers only its shard: a planted change's
rows may be in another.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from attnkit_perf.decide.merge import merge_verdicts
from attnkit_perf.formats.verdict import VerdictDocument

#: Perf outcomes that are never a false alarm on unchanged code.
QUIET = ("same", "faster")
#: Perf outcomes that fail a row: what a planted change must cause on its affected row.
FAILING = ("slower", "more-memory", "kept-memory")
#: Rows the gate could not decide: unclear after their measuring budget, or left undecided by the
#: time budget (the PR tier's default lets them pass, named). No alarm, and no evidence of quiet
#: either: listed apart, each with its reason, with their count.
UNDECIDED = ("inconclusive", "unfinished", "not-reached")


def correctness_failures(junit: Path) -> tuple[dict, list[str]]:
    """How many tests of a JUnit file ran, failed, errored and were skipped, and the failed ids."""
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    kinds = {kind: [c for c in cases if c.find(kind) is not None] for kind in ("failure", "error", "skipped")}
    counts = {"run": len(cases), **{kind: len(found) for kind, found in kinds.items()}}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in kinds["failure"] + kinds["error"]]
    return counts, failed


def perf_rows(verdict: Path) -> tuple[dict, list[dict]]:
    """The verdict's summary (mode, passed, complete, counts, shard) and its rows."""
    doc = json.loads(verdict.read_text())
    head = {key: doc.get(key) for key in ("mode", "passed", "counts", "shard")}
    head["complete"] = doc.get("complete", True)
    return head, doc.get("benchmarks", [])


def join_shards(folders: list[Path], out: Path) -> Path:
    """The folders of one step run as shards, as one step folder ``out`` (see the module's
    docstring): what :func:`summarize` reads, for the step as a whole."""
    if out.exists():
        shutil.rmtree(out)
    (out / "gate").mkdir(parents=True)
    statuses = [_read(f / "status", "not run") for f in folders]
    failed = [s for s in statuses if s != "0"]
    (out / "status").write_text((failed[0] if failed else "0") + "\n")
    (out / "command").write_text(" ; ".join(_read(f / "command") for f in folders) + "\n")
    walls = [_read(f / "times").splitlines()[0] for f in folders if _read(f / "times")]
    (out / "times").write_text("\n".join([max(walls, key=_seconds)] if walls else []) + "\n")
    verdicts = [
        (str(f), VerdictDocument.read(f / "gate" / "verdict.json"))
        for f in folders
        if (f / "gate" / "verdict.json").is_file()
    ]
    if verdicts:
        merge_verdicts(verdicts).write(out / "gate" / "verdict.json")
    cases = [
        c
        for f in folders
        if (f / "gate" / "correctness.xml").is_file()
        for c in ET.parse(f / "gate" / "correctness.xml").getroot().iter("testcase")
    ]
    suite = ET.Element("testsuite", name="shards", tests=str(len(cases)))
    suite.extend(cases)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(out / "gate" / "correctness.xml")
    if (folders[0] / "cases").is_file():  # the planted change's cases: the same in every shard
        shutil.copyfile(folders[0] / "cases", out / "cases")
    effects = [f"{f}:\n{_read(f / 'ab.txt')}" for f in folders if _read(f / "ab.txt")]
    if effects:
        (out / "ab.txt").write_text("\n".join(effects) + "\n")
    return out


#: A step's exit status when ``timeout`` stopped it: 124, or 137 when it had to be killed.
STOPPED = ("124", "137")


def _seconds(times_line: str) -> int:
    """``wall time: 412 s`` -> 412."""
    words = times_line.split()
    return int(words[2]) if len(words) > 2 and words[2].isdigit() else 0


def _read(path: Path, default: str = "") -> str:
    return path.read_text().strip() if path.is_file() else default


def summarize(folder: Path) -> tuple[bool, list[str]]:
    """One step's verdict and its Markdown lines."""
    step = folder.name
    status = _read(folder / "status", "not run")
    lines = [f"## {step}", "", f"- command: `{_read(folder / 'command')}`", f"- exit status: {status}"]
    if status in STOPPED:
        lines.append(
            "- stopped by its time limit (--step-timeout): the counts below are what it finished, "
            "and its log.txt ends with the slowest tests"
        )
    lines += [f"- {line}" for line in _read(folder / "times").splitlines() if line]
    gate = folder / "gate" if (folder / "gate").is_dir() else folder
    alarms: list[str] = []
    junit = gate / "correctness.xml"
    if junit.is_file():
        counts, failed = correctness_failures(junit)
        lines.append("- correctness: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        alarms += [f"correctness failed: {name}" for name in failed]
    verdict = gate / "verdict.json"
    rows: list[dict] = []
    if verdict.is_file():
        head, rows = perf_rows(verdict)
        lines.append(
            f"- perf ({head['mode']}): passed={head['passed']} complete={head['complete']} "
            f"counts={head['counts']}"
        )
        if not head["complete"]:
            alarms.append("perf: the verdict is incomplete (the run was stopped)")
        shard = head.get("shard") or {}
        if "index" in shard and shard.get("count", 1) > 1:
            lines.append(
                f"- shard {shard['index']} of {shard['count']}: its verdict covers its rows only; judge "
                "the step whole by naming every shard's folder (python -m attnkit_tools.gate.acceptance)"
            )
    else:
        lines.append("- perf: no verdict.json (nothing was compared)")
    if step.startswith("change-"):
        words = _read(folder / "cases").split()
        hit = [r for r in rows if r["outcome"] in FAILING and all(w in r["name"] for w in words)]
        passed = status not in ("0", "not run") and bool(hit)
        lines.append(f"- rows named by the change's cases ({' '.join(words)}), failed: {len(hit)}")
        lines += [f"  - {r['outcome']} {r['name']} ratio={r.get('ratio')}: {r.get('reason')}" for r in hit]
        effect = _read(folder / "ab.txt")
        if effect:
            lines += ["", "True effect (attnkit_tools.gate.ab_dobench, head/base):", "", "```", effect, "```"]
        detection = _read(folder / "detection.md")
        if detection:
            lines += ["", detection]
    else:
        alarms += [
            f"perf {r['outcome']}: {r['name']}: {r.get('reason')}"
            for r in rows
            if r["outcome"] not in QUIET + UNDECIDED
        ]
        undecided = [r for r in rows if r["outcome"] in UNDECIDED]
        passed = status == "0" and not alarms and verdict.is_file()
        lines.append(f"- false alarms: {len(alarms)}")
        lines += [f"  - {alarm}" for alarm in alarms]
        if undecided:
            lines.append(
                f"- undecided (no alarm, no evidence of quiet): {len(undecided)} of {len(rows)} rows"
            )
            lines += [f"  - {r['outcome']} {r['name']}: {r.get('reason')}" for r in undecided]
    lines += [f"- **verdict: {'PASS' if passed else 'FAIL'}**", ""]
    return passed, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.gate.acceptance", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out", type=Path, help="the acceptance run's folder: summary.md is written here")
    parser.add_argument("steps", type=Path, nargs="+", help="the steps' folders, in the order they ran")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    verdicts, lines = [], ["# GPU acceptance of the gate", ""]
    groups: dict[str, list[Path]] = {}
    for folder in args.steps:
        groups.setdefault(folder.name, []).append(folder)
    for name, group in groups.items():
        folder = group[0] if len(group) == 1 else join_shards(group, args.out / f"{name}-merged")
        passed, step_lines = summarize(folder)
        verdicts.append((folder.name, passed))
        lines += step_lines
    lines += ["## Verdicts", ""] + [f"- {name}: {'PASS' if ok else 'FAIL'}" for name, ok in verdicts]
    text = "\n".join(lines) + "\n"
    (args.out / "summary.md").write_text(text)
    sys.stdout.write(text)
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
