"""Find the first commit where a benchmark got slower (or its peak memory grew).

    python -m attnkit_perf.commands.bisect GOOD BAD -k 'fwd[triton-bf16-B4-H16-N4096-D128-causal]'

The candidates are the commits after GOOD up to BAD on the ancestry path (``git rev-list
--ancestry-path GOOD..BAD``), oldest first. Each step compares a candidate with GOOD in paired
mode (:mod:`attnkit_perf.measure.paired_session`: both commits' ``src`` extracted by
:mod:`attnkit_perf.measure.checkout`, worker processes of each on this GPU, the gate's decision
rule :class:`attnkit_perf.decide.paired_rule.PairedRule`, a slowdown confirmed on fresh processes)
and bisects on "slower than GOOD". Comparing with GOOD rather than with a neighbour keeps the
question the same at every step, so a slowdown that builds up over several commits is found
where it first exceeds the threshold, and a step is never judged by a neighbour that is itself
slow. The commit found is then compared with its parent, which says whether it is a step of
its own or the last of a creep. Every comparison is printed (ratio, interval, outcome).

A step's outcome counts as bad when it is slower or more-memory; same, faster and inconclusive
count as not slower (a slowdown large enough to bisect is called slower). Before searching,
BAD is compared with GOOD: a range whose BAD is not slower than GOOD has nothing to find.
Errors (exit status 2): a ref that is not a commit, GOOD not an ancestor of BAD, an empty
range, a benchmark not in the grid, BAD not slower than GOOD.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnkit_perf.decide import gate
from attnkit_perf.decide.gate import Decision

#: Outcomes that make a candidate "slower than GOOD".
BAD_OUTCOMES = ("slower", "more-memory")

#: ``compare(good_commit, candidate_commit) -> Decision``: one paired comparison.
Compare = Callable[[str, str], Decision]


class BisectError(Exception):
    """The range or the benchmark cannot be bisected; the message says why."""


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip()}")
    return result.stdout.strip()


def resolve(repo: Path, ref: str) -> str:
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except BisectError:
        raise BisectError(f"{ref!r} is not a commit of {repo}") from None


def candidates(repo: Path, good: str, bad: str) -> list[str]:
    """The commits after ``good`` up to ``bad`` (included) that descend from ``good``, oldest
    first. Raises :class:`BisectError` for a range that holds none."""
    good_sha, bad_sha = resolve(repo, good), resolve(repo, bad)
    if good_sha == bad_sha:
        raise BisectError(f"GOOD and BAD are the same commit ({good_sha[:12]}): nothing to bisect")
    ancestor = subprocess.run(
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", good_sha, bad_sha],
        capture_output=True,
        check=False,
    )
    if ancestor.returncode != 0:
        raise BisectError(f"GOOD {good} ({good_sha[:12]}) is not an ancestor of BAD {bad} ({bad_sha[:12]})")
    listed = _git(repo, "rev-list", "--ancestry-path", "--reverse", f"{good_sha}..{bad_sha}")
    return listed.split()


@dataclass
class Step:
    """One comparison of the search: ``commit`` against ``against``."""

    commit: str
    against: str
    decision: Decision

    @property
    def bad(self) -> bool:
        return self.decision.outcome in BAD_OUTCOMES

    def line(self) -> str:
        d = self.decision
        ratio = "-" if d.ratio is None else f"x{d.ratio:.4f}"
        ci = "" if d.ci is None else f" [{d.ci[0]:.4f}, {d.ci[1]:.4f}]"
        verdict = "slower than it" if self.bad else "not slower"
        head = f"{self.commit[:12]} against {self.against[:12]}"
        return f"{head}: {d.outcome} {ratio}{ci} -> {verdict} ({d.reason})"


@dataclass
class Result:
    first_bad: str
    steps: list[Step]
    parent_step: Step | None


def search(commits: list[str], good: str, compare: Compare, say: Callable[[str], None] = print) -> Result:
    """Binary search for the first of ``commits`` (oldest first, the last one BAD) that is slower
    than ``good``; each comparison is printed through ``say`` as it is made."""
    steps: list[Step] = []

    def judge(commit: str, against: str, label: str) -> Step:
        step = Step(commit, against, compare(against, commit))
        steps.append(step)
        say(f"{label}: {step.line()}")
        return step

    if not judge(commits[-1], good, "BAD").bad:
        raise BisectError(
            f"BAD {commits[-1][:12]} is not slower than GOOD {good[:12]} "
            f"({steps[-1].decision.outcome}): no slowdown to bisect in this range"
        )
    low, high = 0, len(commits) - 1  # commits[high] is bad; everything before low is not
    while low < high:
        mid = (low + high) // 2
        remaining = max(1, (high - low).bit_length())
        if judge(commits[mid], good, f"step {len(steps)} (~{remaining} left)").bad:
            high = mid
        else:
            low = mid + 1
    first = commits[high]
    parent = good if high == 0 else commits[high - 1]
    parent_step = None if high == 0 else judge(first, parent, "its parent")
    return Result(first, steps, parent_step)


def find_case(name: str):
    """The grid's benchmark called ``name`` (``BenchCase.name``), a backend registered through an
    entry point included, or a :class:`BisectError` naming the closest ones."""
    from attnkit.builtins import builtin_names
    from attnkit.plugins import broken_entry_points
    from attnkit.registry import backend_names
    from attnkit_perf.run.backend_choice import grid_cases

    plugins = [backend for backend in backend_names() if backend not in builtin_names()]
    cases = [*grid_cases(None, gpu=True), *grid_cases(None, gpu=False)]
    if plugins:
        cases += [*grid_cases(plugins, gpu=True), *grid_cases(plugins, gpu=False)]
    grid = {c.name: c for c in cases}
    if name in grid:
        return grid[name]
    for key, err in broken_entry_points().items():  # its cases are named after the backend
        if re.search(rf"\[{re.escape(key)}-", name):
            raise BisectError(str(err))
    close = difflib.get_close_matches(name, grid, n=3, cutoff=0.5)
    hint = f"; closest: {', '.join(close)}" if close else ""
    raise BisectError(
        f"no benchmark {name!r} in the grid (names as in the verdict, e.g. {next(iter(grid))}){hint}"
    )


def paired_compare(
    repo: Path, case, thresholds: gate.Thresholds, alpha: float, budget_s: float | None
) -> Compare:
    """A :data:`Compare` that measures in paired mode on this machine's device. In a repository
    other than attnkit's, the commits compared are that repository's, over the installed attnkit
    (:mod:`attnkit_perf.run.sides`)."""
    from attnkit_perf.decide.paired_rule import PairedRule
    from attnkit_perf.measure.checkout import BaseError
    from attnkit_perf.measure.paired_session import PairedSettings
    from attnkit_perf.measure.repo import RepositoryError, find_repository
    from attnkit_perf.run import sides
    from attnkit_perf.run.stored_recheck import paired_decision

    try:
        repository = find_repository(repo, repo)
    except RepositoryError as err:
        raise BisectError(str(err)) from err
    scratch = Path(tempfile.mkdtemp(prefix="attnkit-bisect-"))
    roots: dict[str, list[Path]] = {}
    rule = PairedRule(thresholds, alpha, thresholds.slower)
    settings = PairedSettings(budget_s=budget_s) if budget_s else PairedSettings()

    def code(commit: str) -> list[Path]:
        if commit not in roots:
            try:
                roots[commit] = sides.materialise(commit, repository, repo, scratch / commit)[0]
            except BaseError as err:
                raise BisectError(str(err)) from err
        return roots[commit]

    def compare(base: str, head: str) -> Decision:
        session = sides.open_paired(
            code(base), code(head), {"base": base, "head": head}, repository, [case.backend]
        )
        try:
            decision, unsupported = paired_decision(session, case, rule, settings)
            if decision is None:
                return Decision("inconclusive", reason=f"a side cannot run the benchmark: {unsupported}")
            return decision
        finally:
            session.close()

    # The checkouts live as long as the comparison that measures them.
    weakref.finalize(compare, shutil.rmtree, scratch, ignore_errors=True)
    return compare


def main(argv: list[str] | None = None, compare_factory=None) -> int:
    """``compare_factory(repo, case, thresholds, alpha, budget_s) -> Compare`` replaces the
    paired measurement (the tests pass a fake)."""
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.commands.bisect",
        description=__doc__.split("\n")[0],
        epilog="example: python -m attnkit_perf.commands.bisect v1.2 HEAD "
        "-k 'fwd[triton-bf16-B4-H16-N4096-D128-causal]' (a benchmark's name as the verdict and "
        "the report show it; in another repository its import roots come from [tool.attnkit] src "
        "of its pyproject.toml, docs/EXTENDING.md)",
    )
    parser.add_argument("good", metavar="GOOD", help="a commit where the benchmark was fast")
    parser.add_argument("bad", metavar="BAD", help="a later commit where it is slower")
    parser.add_argument("-k", dest="benchmark", required=True, help="benchmark name, as in the verdict")
    parser.add_argument("--repo", default=".", help="the git checkout (default: the current folder)")
    parser.add_argument("--slower", type=float, default=gate.Thresholds.slower, help="practical threshold")
    parser.add_argument("--budget-s", type=float, default=None, help="measuring time per comparison")
    parser.add_argument("--allow-cpu", action="store_true", help="measure on the CPU (the gate's own tests)")
    args = parser.parse_args(argv)
    repo = Path(args.repo).resolve()
    try:
        case = find_case(args.benchmark)
        commits = candidates(repo, args.good, args.bad)
        good = resolve(repo, args.good)
        thresholds = gate.Thresholds(slower=args.slower)
        # The run's false-alarm budget over the comparisons a search of this range makes.
        alpha = gate.per_benchmark_alpha(thresholds, len(commits).bit_length() + 2)
        if compare_factory is None:
            _check_device(args.allow_cpu)
            compare_factory = paired_compare
        compare = compare_factory(repo, case, thresholds, alpha, args.budget_s)
        print(f"bisecting {case.name} over {len(commits)} commits after GOOD {good[:12]}")
        result = search(commits, good, compare)
    except BisectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    subject = _git(repo, "log", "-1", "--format=%s", result.first_bad)
    print(f"first slower commit: {result.first_bad} {subject}")
    if result.parent_step is not None and not result.parent_step.bad:
        print("  (not slower than its parent on its own: the slowdown built up over several commits)")
    return 0


def _check_device(allow_cpu: bool) -> None:
    import torch

    if not torch.cuda.is_available() and not allow_cpu:
        raise BisectError("no CUDA device here: bisect times GPU work (--allow-cpu measures on the CPU)")


if __name__ == "__main__":
    sys.exit(main())
