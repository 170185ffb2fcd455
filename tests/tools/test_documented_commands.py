"""Every ``python -m`` command the docs, the README, the CI scripts and workflows name exists and
answers ``--help``: a renamed or moved module fails here, not in a reader's shell."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def documented_modules() -> list[str]:
    sources = [
        ROOT / "README.md",
        ROOT / "tox.ini",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob(".ci/*.sh"),
        *ROOT.glob("tests/perf/*.sh"),
        *ROOT.glob(".github/workflows/*.yml"),
    ]
    return sorted({name for path in sources for name in COMMAND.findall(path.read_text())})


@pytest.fixture(scope="module")
def help_answers() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _ASK_EACH, *documented_modules()],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_docs_name_commands():
    named = set(documented_modules())
    assert {"attnkit_perf.select", "attnkit_tools.pages.regenerate", "attnkit_tools.gate.ab_dobench"} <= named


@pytest.mark.parametrize("module", documented_modules())
def test_a_documented_command_answers_help(module, help_answers):
    code, shown = help_answers[module]
    assert code in (0, None), f"python -m {module} --help exited {code}: {shown}"
    assert "usage" in shown.lower(), f"python -m {module} --help printed no usage: {shown}"
