"""The selection is made once per gate run: ``python -m attnkit_perf.select --json-out FILE``
writes it, each pytest step reads it (``--attnkit-selection=FILE``) and xdist's workers never
recompute it; ``--attnkit-changes-since`` computes it once, in the controller."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from attnkit_perf.formats.schema import validate
from attnkit_perf.measure.cases import gpu_suite_cases
from attnkit_perf.select import collection
from attnkit_perf.select.__main__ import main as select_main
from attnkit_perf.select.rules import Affected, affected

ROOT = Path(__file__).resolve().parents[2]
H200 = "nvidia-h200"
TESTS = {
    "tests/correctness/test_by_backend.py": (
        "import pytest\n\n\n"
        '@pytest.mark.parametrize("backend", ["triton", "tiled", "sdpa-math"])\n'
        "def test_each(backend):\n    assert backend\n"
    ),
    "tests/correctness/test_independent.py": "def test_alone():\n    assert 1\n",
}
#: Committed with the base: notes each time a process computes the selection.
COUNTING_CONFTEST = """
import os

from attnkit_perf.select import collection

_decide = collection.decide


def _counted(*args, **kwargs):
    with open(os.environ["ATTNKIT_DECISIONS_LOG"], "a") as log:
        log.write("decided\\n")
    return _decide(*args, **kwargs)


collection.decide = _counted
"""


def _git(repo: Path, *args: str) -> None:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env)


@pytest.fixture
def repo(pytester, monkeypatch, tmp_path):
    """A committed repository (the library's source linked, two test modules, a conftest that
    counts computed selections in ``log``), with one planted change: a table every backend's
    rows read (baselines of the CPU), so the backend tests run and the independent one does not."""
    (pytester.path / "src").symlink_to(ROOT / "src", target_is_directory=True)
    for name, text in {**TESTS, "conftest.py": COUNTING_CONFTEST}.items():
        (pytester.path / name).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / name).write_text(text)
    _git(pytester.path, "init", "-q", "-b", "main")
    _git(pytester.path, "add", ".")
    _git(pytester.path, "commit", "-qm", "base")
    planted = pytester.path / "baselines/cpu-x86_64/noise-paired.json"
    planted.parent.mkdir(parents=True)
    planted.write_text("{}\n")
    log = tmp_path / "decisions.log"
    monkeypatch.setenv("ATTNKIT_DECISIONS_LOG", str(log))
    # An in-process run's conftest wraps this process's collection.decide: put it back after the
    # test, so that the next test's run counts its own decisions, not through every earlier wrapper.
    monkeypatch.setattr(collection, "decide", collection.decide)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    # Run inside an xdist worker of the outer run, the inner run's workers would inherit its
    # worker variables: the inner run must see a plain shell's environment.
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    return pytester.path, log


def _decisions(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_a_selection_file_is_read_by_every_process_and_never_recomputed(repo, pytester, capsys, workers):
    root, log = repo
    selection = root.parent / "selection.json"
    assert select_main(["--base", "main", "--root", str(root), "--json-out", str(selection)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("backends: ") and "noise-paired.json" in printed, "the summary for people"
    assert json.loads(selection.read_text())["format"] == "attnkit-selection/1"
    # Without its repository, a process that computed the selection would run everything.
    shutil.rmtree(root / ".git")
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_perf.plugin", f"--attnkit-selection={selection}", *workers, *TESTS
    )
    result.assert_outcomes(passed=3, deselected=1) if not workers else result.assert_outcomes(passed=3)
    assert _decisions(log) == 0


def test_changes_since_is_computed_once_and_handed_to_the_workers(repo, pytester):
    _, log = repo
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_perf.plugin", "--attnkit-changes-since", "main", "-n", "2", *TESTS
    )
    result.assert_outcomes(passed=3)
    assert _decisions(log) == 1, "the controller decides; its two workers take its decision"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"format": "attnkit-selection/0"}, "is not a valid selection file"),
        (None, "is not readable JSON"),
    ],
    ids=["other-format", "not-json"],
)
def test_a_bad_selection_file_is_a_usage_error_naming_it(repo, pytester, content, message):
    root, _ = repo
    selection = root.parent / "selection.json"
    selection.write_text("{" if content is None else json.dumps(content))
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_perf.plugin", f"--attnkit-selection={selection}", *TESTS
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*attnkit select: *selection*{selection.name}*{message}*"])


def test_the_file_holds_the_decision_as_made():
    """Written and read back, a decision keeps every row's answer, table entries included; one
    made for any GPU model takes the run's, one made for another model is refused."""
    path = f"src/attnkit/triton/configs/{H200}.json"
    table = json.loads((ROOT / path).read_text())
    table["families"]["16bit-d64-full"]["fwd"]["num_warps"] = 8
    before = json.dumps(table)
    made = affected(ROOT, "main", [path, "src/attnkit/kvcache.py"], None, before=lambda p: before)
    # As the command checks it before writing: the table's changed entries are an array.
    validate("selection", made.to_dict(), "the selection made")
    assert [e["entries"] for e in made.to_dict()["changed"] if e["entries"]] == [["families/16bit-d64-full"]]
    data = json.loads(json.dumps(made.to_dict()))
    for gpu in (H200, "nvidia-h100-80gb-hbm3"):
        read = Affected.from_dict(data, gpu)
        expected = affected(ROOT, "main", made.changed, gpu, before=lambda p: before)
        for case in gpu_suite_cases():
            args = (case.backend, case.pass_name, case)
            assert read.row_skip(*args) == expected.row_skip(*args), (gpu, case.name)
    with pytest.raises(ValueError, match="made for GPU model 'nvidia-h200'"):
        Affected.from_dict({**data, "gpu": H200}, "nvidia-h100-80gb-hbm3")
