"""Every ``python -m`` command the docs, the README, the CI scripts and workflows name exists and
answers ``--help``, and so does every runnable tool: a renamed or moved module fails here, not in a
reader's shell."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli where the standard library has no tomllib
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
#: ``python -m attnkit...`` with a dotted module name (a placeholder such as ``.NAME`` or ``.X``
#: is not one).
COMMAND = re.compile(r"python3? -m ((?:attnkit_tools|attnkit_perf|attnkit)(?:\.[a-z_]+)+)\b(?!\.[A-Z])")

#: Runs each module as ``python -m MODULE --help`` would, all in one interpreter (torch is
#: imported once), and prints each one's exit code and output as JSON.
_ASK_EACH = """
import contextlib, io, json, runpy, sys
answers = {}
for module in sys.argv[1:]:
    shown = io.StringIO()
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(shown):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = None
        except SystemExit as end:
            code = end.code
        except Exception as err:
            code = repr(err)
    answers[module] = [code, shown.getvalue()]
print(json.dumps(answers))
"""


#: Generated pages whose header names the command of the commit they were measured at, since
#: moved: each is regenerated on its machine (``python -m attnkit_tools.pages``), which writes
#: today's command, and then leaves this table. No H100 is at hand to remeasure the H100's.
MEASURED_BEFORE_A_MOVE = {
    "docs/nvidia-h100-80gb-hbm3/PER_CALL.md": "attnkit_tools.per_call",
    "docs/nvidia-h100-80gb-hbm3/PROFILE.md": "attnkit_tools.profile",
}


def _page_header(path: Path) -> str:
    """A generated page's first lines, where it says which command produced it."""
    return "\n".join(path.read_text().splitlines()[:6])


def documented_modules() -> list[str]:
    sources = [
        ROOT / "README.md",
        ROOT / "tox.ini",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob(".ci/*.sh"),
        *ROOT.glob("tests/perf/*.sh"),
        *ROOT.glob(".github/workflows/*.yml"),
    ]
    texts = [path.read_text() for path in sources]
    texts += [
        _page_header(page)
        for page in ROOT.glob("docs/*/*.md")
        if str(page.relative_to(ROOT)) not in MEASURED_BEFORE_A_MOVE
    ]
    return sorted({name for text in texts for name in COMMAND.findall(text)})


#: The tools installed as console scripts (pyproject's ``[project.scripts]``): {module: script}.
CONSOLE_SCRIPTS = {
    target.split(":")[0]: script
    for script, target in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].items()
}


def runnable_tools() -> list[str]:
    """Every module of attnkit_tools that runs as ``python -m``: named in the docs or not, a
    tool asked for ``--help`` answers it, rather than starting its measurement."""
    tools = ROOT / "src" / "attnkit_tools"
    return sorted(
        ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)
        for path in tools.rglob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    )


RUNNABLE_TOOLS = runnable_tools()
#: What is asked for ``--help``: every documented command and every runnable tool.
ASKED = sorted({*documented_modules(), *RUNNABLE_TOOLS})


@pytest.mark.parametrize("page", sorted(MEASURED_BEFORE_A_MOVE))
def test_a_page_measured_before_a_move_still_awaits_its_remeasurement(page):
    """The table cannot outlive what it excuses: a regenerated page names today's command."""
    moved = MEASURED_BEFORE_A_MOVE[page]
    assert moved in COMMAND.findall(_page_header(ROOT / page)), (
        f"{page} no longer names python -m {moved}: remove it from MEASURED_BEFORE_A_MOVE"
    )
    assert importlib.util.find_spec(moved) is None, f"{moved} exists again: {page} names a command that runs"


@pytest.fixture(scope="module")
def help_answers() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _ASK_EACH, *ASKED],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_docs_name_commands():
    named = set(documented_modules())
    assert {"attnkit_perf.select", "attnkit_tools.pages.regenerate", "attnkit_tools.gate.ab_dobench"} <= named


def test_every_runnable_tool_is_found():
    assert {"attnkit_tools.demo", "attnkit_tools.gate.timing_check", "attnkit_tools.tune.configs"} <= set(
        RUNNABLE_TOOLS
    )


@pytest.mark.parametrize("module", ASKED)
def test_a_documented_command_answers_help(module, help_answers):
    code, shown = help_answers[module]
    assert code in (0, None), f"python -m {module} --help exited {code}: {shown}"
    assert "usage" in shown.lower(), f"python -m {module} --help printed no usage: {shown}"
    if module in RUNNABLE_TOOLS:  # the usage line is the command to type, not a file name
        called = CONSOLE_SCRIPTS.get(module, f"python -m {module}")
        assert f"usage: {called} " in shown, f"python -m {module} --help names another command: {shown}"
