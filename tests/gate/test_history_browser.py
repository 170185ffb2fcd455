"""The history site in a real headless browser (Chromium driven by playwright): every page loads
with no console error, failed request or script error; the planted step and drift, and only
they, are on the regressions page; the charts draw their traces.

Needs a Chromium-family browser (``$ATTNKIT_CHROMIUM``, else ``chromium``, ``google-chrome``,
``chromium-browser`` on PATH) and the ``playwright`` package; playwright's own browser download
is not used. Without them the tests skip, unless ``ATTNKIT_REQUIRE_BROWSER=1`` (CI's
``.ci/run`` sets it) makes that a failure.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from history_fixture import DRIFT, FLAT, GPU_KEY, STEP, planted_store

from attnkit_perf.history import history_link
from attnkit_perf.history.links import CommitLinks, commit_anchor
from attnkit_perf.history.site import publish, slug

BROWSERS = ("chromium", "google-chrome", "google-chrome-stable", "chromium-browser")
#: Headless, and nothing that reaches the network or needs a GPU or a sandbox of its own (CI
#: containers run as root).
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _browser() -> tuple[str | None, str]:
    """``(executable, "")`` or ``(None, why not)``."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None, "the playwright package is not installed (pip install playwright)"
    named = os.environ.get("ATTNKIT_CHROMIUM")
    found = named or next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if not found or not Path(found).exists():
        return (
            None,
            f"no Chromium-family browser ({named or ', '.join(BROWSERS)} not found; set ATTNKIT_CHROMIUM)",
        )
    return found, ""


@pytest.fixture(scope="module")
def browser():
    executable, why = _browser()
    if executable is None:
        if os.environ.get("ATTNKIT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ATTNKIT_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as play:
        chromium = play.chromium.launch(executable_path=executable, args=BROWSER_ARGS, headless=True)
        # One context for every page: plotly.min.js (4.8 MB) is fetched and compiled once.
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        yield context
        context.close()
        chromium.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("history-site")
    shas = planted_store(root / "store")
    links = CommitLinks("https://github.com/acme/attnkit/commit/{sha}", "")
    publish(root / "store", root / "site", links)
    return root / "site", shas


@pytest.fixture(scope="module")
def served(site) -> str:
    """The site over HTTP on localhost, as a Pages host serves it (a 404 counts as an error)."""
    handler = functools.partial(_QuietHandler, directory=str(site[0]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class Visit:
    """A page opened in a fresh tab, with every console error, script error, failed request
    and HTTP error status it caused."""

    def __init__(self, browser, url: str) -> None:
        self.problems: list[str] = []
        self.page = browser.new_page()
        page = self.page
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda err: self.problems.append(f"script error: {err}"))
        page.on("requestfailed", lambda req: self.problems.append(f"request failed: {req.url}"))
        page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))
        page.goto(url, wait_until="load")

    def close(self) -> None:
        self.page.close()


def _pages(site_dir: Path) -> list[str]:
    return sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*.html"))


def test_every_page_loads_without_errors(browser, site, served):
    pages = _pages(site[0])
    assert len(pages) == 3 + 4, f"pages: {pages}"
    problems = []
    for name in pages:
        visit = Visit(browser, served + name)
        charts = visit.page.locator(".js-plotly-plot")
        for k in range(charts.count()):  # a chart that fails to draw leaves no .main-svg
            charts.nth(k).locator(".main-svg").first.wait_for(timeout=20_000)
        problems += [f"{name}: {p}" for p in visit.problems]
        visit.close()
    assert not problems, "\n".join(problems)


def test_the_regressions_page_shows_the_planted_step_and_drift_and_nothing_else(browser, site, served):
    shas = site[1]
    visit = Visit(browser, served + "regressions.html")
    rows = visit.page.locator("tr.finding")
    found = rows.evaluate_all(
        "rows => rows.map(r => [r.dataset.benchmark, r.dataset.kind, r.dataset.good, r.dataset.bad,"
        " r.innerText])"
    )
    kinds = {(name, kind) for name, kind, *_ in found}
    assert kinds == {(STEP, "step"), (DRIFT, "drift")}, f"the page lists {sorted(kinds)}"
    text = visit.page.inner_text("main")
    for name in FLAT:
        assert name not in text, f"unchanged benchmark {name} is on the regressions page"
    step = next(row for row in found if row[1] == "step")
    assert (step[2], step[3]) == (shas[17], shas[18]), f"step between {step[2][:7]} and {step[3][:7]}"
    assert f"python -m attnkit_perf.commands.bisect {shas[17][:12]} {shas[18][:12]} -k '{STEP}'" in step[4]
    assert re.search(r"\+[34]\.\d%", step[4]), f"step row shows no +3.x/+4.x% change: {step[4]!r}"
    commit_link = visit.page.locator(f'tr[data-kind="step"] a[href$="/commit/{shas[18]}"]')
    assert commit_link.count() == 1, "the step's first bad commit is not linked"
    visit.page.locator('tr[data-kind="step"] td a').first.click()
    visit.page.wait_for_url(f"**/{GPU_KEY}/{slug(STEP)}.html")
    visit.page.locator("#series .main-svg").first.wait_for()
    assert not visit.problems, "\n".join(visit.problems)
    visit.close()


def test_the_benchmark_chart_draws_its_series_band_level_and_step(browser, site, served):
    shas = site[1]
    visit = Visit(browser, served + f"{GPU_KEY}/{slug(STEP)}.html")
    chart = visit.page.locator("#series")
    chart.locator(".main-svg").first.wait_for()
    traces = chart.locator(".scatterlayer .trace")
    assert traces.count() == 4, f"{traces.count()} traces drawn, want band edges, median, level"
    median_path = traces.nth(2).locator("path.js-line").get_attribute("d") or ""
    vertices = len(re.findall(r"[ML]", median_path))
    assert vertices == len(shas), f"the median line has {vertices} vertices, want one per run ({len(shas)})"
    assert traces.nth(2).locator(".points path").count() == len(shas)
    # plotly draws a "tonexty" band as the fill of the trace below it (the q3 edge).
    band = chart.locator("path.js-fill").first.get_attribute("d") or ""
    assert band, "the noise band is not filled"
    assert chart.locator(".shapelayer path").count() == 1, "the step's commits are not shaded"
    label = chart.locator(".annotation").text_content() or ""
    assert re.fullmatch(r"step \+[34]\.\d%", label), f"the step's label reads {label!r}"
    visit.close()


def test_the_gpu_page_overview_draws_every_benchmark_and_anchors_each_commit(browser, site, served):
    shas = site[1]
    visit = Visit(browser, served + f"{GPU_KEY}/index.html")
    chart = visit.page.locator("#overview")
    chart.locator(".main-svg").first.wait_for()
    assert chart.locator(".scatterlayer .trace").count() == 4
    legend = chart.locator(".legend").text_content() or ""
    assert STEP in legend and DRIFT in legend and FLAT[0] not in legend, f"legend: {legend!r}"
    for sha in shas:
        assert visit.page.locator(f"#{commit_anchor(sha)}").count() == 1, f"no row for commit {sha[:7]}"
    visit.close()


def test_a_verdicts_base_link_opens_its_run(browser, site, served):
    shas = site[1]
    verdict = {"base": {"provenance": {"gpu_key": GPU_KEY, "commit": shas[20][:10]}}}
    url = history_link(verdict, served)
    visit = Visit(browser, url)
    row = visit.page.locator(f"#{commit_anchor(shas[20])}")
    assert row.count() == 1 and row.is_visible(), f"{url} shows no run row"
    assert shas[20][:7] in row.inner_text()
    visit.close()
