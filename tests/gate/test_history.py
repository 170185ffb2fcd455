"""The performance history: record (a perf-suite run into the store, schema-validated), the
store's series, step and drift detection on asv's fit, the site's findings, the links."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from history_fixture import DRIFT, DRIFT_AT, FLAT, GPU_KEY, STEP, STEP_AT, planted_store, synthetic_run

from attnkit_perf.formats.schema import validate
from attnkit_perf.history import HistoryError, history_link, record
from attnkit_perf.history.__main__ import main
from attnkit_perf.history.detect import Rule, detect
from attnkit_perf.history.links import bisect_command, github_links
from attnkit_perf.history.record import history_entry
from attnkit_perf.history.site import analyse_store, findings_json
from attnkit_perf.history.store import load_store

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "baselines" / "nvidia-h100-80gb-hbm3" / "baseline.json"


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, list[str]]:
    store = tmp_path_factory.mktemp("history") / "store"
    return store, planted_store(store)


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data), encoding="utf8")
    return path


# --- record -----------------------------------------------------------------------------------


def test_a_recorded_gpu_baseline_keeps_every_benchmark_and_its_provenance(tmp_path):
    run = json.loads(BASELINE.read_text())
    path = record(
        BASELINE, tmp_path, repo=tmp_path, commit="9bbf180", commit_date="2026-11-24T08:55:27+00:00"
    )
    entry = json.loads(path.read_text())
    validate("history-run", entry, str(path))
    assert path.parent.name == "nvidia-h100-80gb-hbm3"
    assert path.name.startswith("20261124T085527Z-9bbf180-"), path.name
    assert len(entry["benchmarks"]) == len(run["benchmarks"])
    first, source = entry["benchmarks"][0], run["benchmarks"][0]
    assert first["name"] == source["extra_info"]["name"]
    assert first["clock"] == "gpu"
    want = float(np.median(source["stats"]["data"])) * 1e3
    assert first["median_ms"] == pytest.approx(want, rel=1e-12), (
        f"median {first['median_ms']} ms, want {want}"
    )
    assert first["q1_ms"] <= first["median_ms"] <= first["q3_ms"]
    assert first["tflops"] == source["extra_info"]["tflops"]
    assert first["peak_bytes"] == source["extra_info"]["peak_bytes"]
    for key in ("driver", "cuda", "torch", "triton", "device_name"):
        assert entry["machine"][key] == run["machine_info"]["attnkit"][key], key


def test_the_commit_and_its_date_come_from_git(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    dated = {**os.environ, "GIT_COMMITTER_DATE": "2026-10-02T10:11:12+02:00"}
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True, env=dated)
    sha = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    run = synthetic_run(0, np.random.default_rng(0))
    run["machine_info"]["attnkit"]["commit"] = sha[:7]
    entry = history_entry(run, repo=tmp_path)
    assert entry["commit"] == sha
    assert entry["commit_date"] == "2026-10-02T08:11:12Z"


def test_a_dirty_checkout_is_not_recorded(tmp_path):
    run = synthetic_run(0, np.random.default_rng(0))
    run["machine_info"]["attnkit"]["commit"] += "+dirty"
    with pytest.raises(HistoryError, match="local changes"):
        record(_write(tmp_path / "run.json", run), tmp_path / "store", repo=tmp_path)


def test_a_run_is_recorded_once(tmp_path):
    results = _write(tmp_path / "run.json", synthetic_run(0, np.random.default_rng(0)))
    kwargs = {"repo": tmp_path, "commit_date": "2026-09-01T12:00:00Z"}
    record(results, tmp_path / "store", **kwargs)
    with pytest.raises(HistoryError, match="already recorded"):
        record(results, tmp_path / "store", **kwargs)


def test_a_file_that_is_not_a_perf_run_is_refused_naming_the_field(tmp_path):
    run = synthetic_run(0, np.random.default_rng(0))
    del run["benchmarks"][0]["extra_info"]["backend"]
    with pytest.raises(HistoryError, match=r"benchmarks/0/extra_info.*'backend' is a required property"):
        record(
            _write(tmp_path / "run.json", run), tmp_path / "store", repo=tmp_path, commit_date="2026-09-01"
        )


def test_a_run_without_a_commit_date_is_refused(tmp_path):
    run = synthetic_run(0, np.random.default_rng(0))
    with pytest.raises(HistoryError, match="--commit-date"):
        history_entry(run, repo=tmp_path)


# --- store and detection ----------------------------------------------------------------------


def test_the_store_orders_runs_by_commit_date(planted):
    store, shas = planted
    history = load_store(store)[GPU_KEY]
    assert [r["commit"] for r in history.runs] == shas
    assert sorted(history.series) == sorted([STEP, DRIFT, *FLAT])
    assert all(len(s.points) == len(shas) for s in history.series.values())


def test_a_run_in_another_gpus_folder_is_an_error(planted, tmp_path):
    store, _ = planted
    moved = tmp_path / "store" / "nvidia-h200"
    moved.mkdir(parents=True)
    source = next((store / GPU_KEY).iterdir())
    (moved / source.name).write_text(source.read_text())
    with pytest.raises(HistoryError, match="lies in the folder of 'nvidia-h200'"):
        load_store(tmp_path / "store")


def test_the_planted_step_and_drift_are_found_and_nothing_else(planted):
    store, shas = planted
    _, analysed = analyse_store(store, Rule.load())
    found = {(f["benchmark"], f["kind"]): f for f in findings_json(analysed)}
    assert set(found) == {(STEP, "step"), (DRIFT, "drift")}, f"found {sorted(found)}"
    step = found[STEP, "step"]
    assert (step["good"], step["bad"]) == (shas[STEP_AT - 1], shas[STEP_AT])
    assert step["change"] == pytest.approx(0.04, abs=0.01), f"step {step['change']:+.2%}, planted +4%"
    drift = found[DRIFT, "drift"]
    good, bad = shas.index(drift["good"]), shas.index(drift["bad"])
    assert good < DRIFT_AT[0] and bad >= DRIFT_AT[-1], f"drift spans runs {good}-{bad}, planted at {DRIFT_AT}"
    assert drift["change"] == pytest.approx(1.015**3 - 1, abs=0.015), f"drift {drift['change']:+.2%}"
    assert step["persists"] and drift["persists"]
    assert step["bisect"] == bisect_command(step["good"], step["bad"], STEP)


@pytest.mark.parametrize("seed", range(25))
def test_detection_over_seeds(seed):
    """The rule on fresh noise: 0.4% run-to-run, as the fixture's, and a noisy 2% series; every
    seed must come out right."""
    rng = np.random.default_rng(seed)
    noisy = lambda factor: [factor(i) * float(np.exp(rng.normal(0, 0.004))) for i in range(36)]
    rule = Rule.load()
    kinds = lambda values: [f.kind for f in detect(values, rule)[1]]
    assert kinds(noisy(lambda i: 1.04 if i >= 18 else 1.0)) == ["step"]
    assert kinds(noisy(lambda i: 1.015 ** sum(i >= at for at in (12, 16, 20)))) == ["drift"]
    assert kinds(noisy(lambda i: 1.0)) == []
    # A host-bound benchmark's runs scatter by 2% and more: the drift threshold rises with it.
    assert kinds([float(np.exp(rng.normal(0, 0.02))) for _ in range(60)]) == []


def test_a_step_that_was_undone_is_listed_as_recovered():
    values = [1.0] * 12 + [1.05] * 8 + [1.0] * 12
    (finding,) = detect(values, Rule.load())[1]
    assert (finding.kind, finding.good, finding.bad, finding.persists) == ("step", 11, 12, False)


def test_too_few_runs_find_nothing():
    assert detect([1.0, 1.0, 1.2, 1.2], Rule.load())[1] == []


def test_a_rule_out_of_range_is_rejected(tmp_path):
    bad = {**Rule.load().as_dict(), "step_min": 0}
    with pytest.raises(ValueError, match="out of range"):
        Rule.load(_write(tmp_path / "rule.json", bad))


# --- links and the command line ---------------------------------------------------------------


@pytest.mark.parametrize(
    "remote",
    [
        "https://github.com/acme/attnkit.git",
        "git@github.com:acme/attnkit.git",
        "https://github.com/acme/attnkit",
    ],
)
def test_github_remotes_give_commit_links(remote):
    links = github_links(remote)
    assert links.commit_url("abc") == "https://github.com/acme/attnkit/commit/abc"
    assert links.compare_url("a", "b") == "https://github.com/acme/attnkit/compare/a...b"


def test_other_remotes_give_no_links():
    assert github_links("https://gitlab.com/acme/attnkit.git").commit_url("abc") == ""


@pytest.mark.parametrize(
    ("commit", "want"),
    [
        ("9bbf180f8d03ad142a91", "https://perf.example/h/nvidia-h100-80gb-hbm3/index.html#commit-9bbf180"),
        ("9bbf180+dirty", "https://perf.example/h/nvidia-h100-80gb-hbm3/index.html#commit-9bbf180"),
        (None, None),
    ],
)
def test_a_verdict_links_to_its_base_on_the_site(commit, want):
    verdict = {"base": {"provenance": {"gpu_key": "nvidia-h100-80gb-hbm3", "commit": commit}}}
    assert history_link(verdict, "https://perf.example/h/") == want


def test_the_command_line_records_publishes_and_lists(planted, tmp_path, capsys):
    store, _ = planted
    run = _write(tmp_path / "run.json", synthetic_run(40, np.random.default_rng(1)))
    copy = tmp_path / "store"
    subprocess.run(["cp", "-r", str(store), str(copy)], check=True)
    args = ["record", "--results", str(run), "--store", str(copy), "--commit-date", "2026-12-01T00:00:00Z"]
    assert main(args) == 0
    assert len(list((copy / GPU_KEY).iterdir())) == len(list((store / GPU_KEY).iterdir())) + 1
    site = tmp_path / "site"
    assert main(["publish", "--store", str(copy), "--out", str(site), "--commit-url", "https://x/{sha}"]) == 0
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    assert pages == sorted(
        ["index.html", "regressions.html", f"{GPU_KEY}/index.html"]
        + [f"{GPU_KEY}/{n.replace('[', '-').rstrip(']')}.html" for n in (STEP, DRIFT, *FLAT)]
    )
    assert (site / "plotly.min.js").stat().st_size > 1_000_000
    assert main(["regressions", "--store", str(copy)]) == 0
    out = capsys.readouterr().out
    assert f"{STEP}  step" in out and f"{DRIFT}  drift" in out, out
    assert main(["publish", "--store", str(tmp_path / "none"), "--out", str(site)]) == 2
    assert "is not a directory" in capsys.readouterr().err
