"""attnkit_tools.pages.regenerate: the plan of every generated page (each tool's arguments accepted by
that tool, every page under docs/<gpu>/, the estimated schedule inside the time limit), the
runner's order, failures and deadline, and the CPU smoke run writing real pages (CPU only)."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

import pytest

from attnkit_tools.pages import gpu_jobs, regenerate

REPO = Path(__file__).resolve().parents[2]
KEY = "nvidia-h200"


SAVED = Path(__file__).parent / "data"


def _plan(tmp_path, smoke=False):
    return regenerate.plan_jobs(REPO / "docs", KEY, tmp_path, smoke=smoke, saved=SAVED if smoke else None)


def test_every_page_is_written_under_its_gpu_folder_and_nothing_outside(tmp_path):
    jobs = _plan(tmp_path)
    written = {page for job in jobs for page in job.pages}
    assert written == set(regenerate.PAGES)
    allowed = (REPO / "docs" / KEY, REPO / "src" / "attnkit" / "auto_tables", tmp_path)
    for job in jobs:
        for step in job.steps:
            for arg in step.argv:
                if arg.startswith("/") and not arg.startswith(sys.executable) and "ncu" not in arg:
                    assert Path(arg).is_relative_to(allowed[0]) or any(
                        Path(arg).is_relative_to(a) for a in allowed[1:]
                    ), f"{job.name} writes or reads {arg}"
    order = {job.name: job.after for job in jobs}
    assert order["auto_check"] == ("auto",), "the check must read the table written just before"
    assert set(order["performance"]) == set(regenerate.GRID_PARTS)


class _Parsed(Exception):
    pass


@pytest.mark.parametrize("smoke", [False, True], ids=["gpu", "smoke"])
def test_each_tool_accepts_the_arguments_it_is_given(smoke, tmp_path, monkeypatch):
    """Every command of the plan parses with its tool's own parser (stopped right after
    parsing): a misspelt option would otherwise first show on the GPU."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for job in _plan(tmp_path, smoke):
        for step in job.steps:
            if step.module != "attnkit_tools":
                continue
            tool, *argv = step.argv
            module = importlib.import_module(f"attnkit_tools.{tool}")
            with pytest.raises(_Parsed):
                module.main(argv)


def test_the_estimated_schedule_fits_the_time_limit_on_four_gpus(tmp_path):
    jobs = [job for job in _plan(tmp_path) if job.name != "profile"]
    jobs.append(gpu_jobs.Job("profile", (), ("PROFILE.md",)))  # as where ncu is installed
    placed, total = gpu_jobs.simulate(jobs, 4)
    assert total <= 540, f"estimated {total:.0f} s on 4 GPUs: {placed}"
    assert placed["auto_check"][1] >= placed["auto"][2], "the check started before the table was written"
    on_one, _ = gpu_jobs.simulate(jobs, 1)
    assert {gpu for gpu, _, _ in on_one.values()} <= {0, None}


def _python(code: str) -> gpu_jobs.Step:
    return gpu_jobs.Step((sys.executable, "-c", code), module=None)


def test_a_failed_job_skips_what_waits_for_it_and_the_deadline_stops_the_rest(tmp_path):
    jobs = [
        gpu_jobs.Job("broken", (_python("raise SystemExit(3)"),)),
        gpu_jobs.Job("after_broken", (_python("pass"),), after=("broken",)),
        gpu_jobs.Job("fine", (gpu_jobs.Step((sys.executable, "-c", "pass"), module=None, optional=False),)),
        gpu_jobs.Job("slow", (_python("import time; time.sleep(60)"),)),
    ]
    status = gpu_jobs.run_jobs(jobs, ["", ""], {}, deadline_s=5.0, logs=tmp_path, log=lambda _: None)
    assert status["broken"].startswith("failed: step 1 exited 3"), status
    assert status["after_broken"].startswith("skipped: broken"), status
    assert status["fine"] == "ok", status
    assert status["slow"].startswith("stopped"), status


def test_an_optional_step_that_fails_lets_the_job_go_on(tmp_path):
    marker = tmp_path / "ran"
    job = gpu_jobs.Job(
        "build_then_measure",
        (
            gpu_jobs.Step((sys.executable, "-c", "raise SystemExit(1)"), module=None, optional=True),
            _python(f"open({str(marker)!r}, 'w').close()"),
        ),
    )
    status = gpu_jobs.run_jobs([job], [""], {}, deadline_s=60.0, logs=tmp_path, log=lambda _: None)
    assert status == {"build_then_measure": "ok"} and marker.exists()


def test_the_smoke_run_writes_every_page_with_provenance_and_no_scratch_path(tmp_path):
    """The CPU run of the same runner: real subprocesses of every tool (measuring at tiny
    sizes where a CPU can, rendering saved measurements where it cannot)."""
    docs = tmp_path / "docs"
    assert regenerate.main(["--smoke", "--saved", str(SAVED), "--docs", str(docs)]) == 0
    folder = next(docs.iterdir())
    written = {p.name for p in folder.glob("*.md")}
    assert written == set(regenerate.PAGES) - {"PROFILE.md"}, written
    for page in folder.glob("*.md"):
        text = page.read_text()
        assert re.search(r"commit", text), f"{page.name} names no commit"
        assert str(tmp_path) not in text and "/tmp/" not in text, f"{page.name} names a scratch path"


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in _LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "links that resolve to nothing:\n" + "\n".join(broken)


def test_a_page_names_no_scratch_path(monkeypatch, tmp_path):
    from attnkit_tools.pages.provenance import produced_by, provenance_table, public_path

    monkeypatch.chdir(tmp_path)
    inside = tmp_path / "docs" / "nvidia-h200" / "PER_CALL.md"
    command = produced_by("pages.per_call", ["--out", "/tmp/w/per_call.json", "--md", inside])
    assert (
        command
        == "python -m attnkit_tools.pages.per_call --out per_call.json --md docs/nvidia-h200/PER_CALL.md"
    )
    rows = provenance_table(
        {"compiled_call_memo": "on: /root/.cache/attnkit/x/fast_calls.so", "ratio": "3/4"}
    )
    assert rows[2:] == ["| compiled_call_memo | on: fast_calls.so |", "| ratio | 3/4 |"]
    assert public_path("https://github.com/a/b") == "https://github.com/a/b"


def test_smoke_without_saved_measurements_is_a_usage_error_that_leaves_no_scratch_folder(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(regenerate.tempfile, "tempdir", str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        regenerate.main(["--smoke"])
    assert exited.value.code == 2
    assert "give --saved DIR" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "a scratch folder was made before the usage error"
