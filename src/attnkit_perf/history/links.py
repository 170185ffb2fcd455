"""Where the dashboard links to: commits and comparisons on the forge, the bisect command, and
the history point a PR's verdict was measured against."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Pins a finding to one commit: builds the commits between GOOD and BAD and measures BENCHMARK.
BISECT_COMMAND = "python -m attnkit_perf.commands.bisect {good} {bad} -k {benchmark}"
_GITHUB = re.compile(r"^(?:https://|ssh://git@|git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class CommitLinks:
    """URL templates: ``commit`` with ``{sha}``, ``compare`` with ``{good}`` and ``{bad}``; an
    empty template means the commits are shown without links."""

    commit: str = ""
    compare: str = ""

    def commit_url(self, sha: str) -> str:
        return self.commit.format(sha=sha) if self.commit else ""

    def compare_url(self, good: str, bad: str) -> str:
        return self.compare.format(good=good, bad=bad) if self.compare else ""


def github_links(remote: str) -> CommitLinks:
    """The templates of a GitHub remote URL (https or ssh); empty ones for any other forge."""
    match = _GITHUB.match(remote.strip())
    if not match:
        return CommitLinks()
    base = f"https://github.com/{match[1]}/{match[2]}"
    return CommitLinks(f"{base}/commit/{{sha}}", f"{base}/compare/{{good}}...{{bad}}")


def default_links(repo: Path | str = ".") -> CommitLinks:
    """From ``git remote get-url origin`` in ``repo`` when it is on GitHub, else no links."""
    try:
        remote = subprocess.run(
            ["git", "remote", "get-url", "origin"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return CommitLinks()
    return github_links(remote)


def bisect_command(good: str, bad: str, benchmark: str) -> str:
    return BISECT_COMMAND.format(good=good[:12], bad=bad[:12], benchmark=shlex.quote(benchmark))


def commit_anchor(sha: str) -> str:
    """The id of a run's row on its GPU page (the first 7 hex digits of its commit)."""
    return f"commit-{sha.lower()[:7]}"


def history_link(verdict, site_url: str) -> str | None:
    """The history page of the GPU model a verdict was measured on, at its base commit's runs.

    ``verdict``: an :class:`attnkit_perf.formats.verdict.VerdictDocument` or its dict. The base is
    the stored baseline's recorded commit (stored mode) or the merge base (paired mode). None
    when the base names no GPU key or no commit."""
    base = verdict["base"] if isinstance(verdict, dict) else verdict.base
    provenance = base.get("provenance") or {}
    key, commit = provenance.get("gpu_key"), (provenance.get("commit") or "").removesuffix("+dirty")
    if not key or not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
        return None
    return f"{site_url.rstrip('/')}/{key}/index.html#{commit_anchor(commit)}"
