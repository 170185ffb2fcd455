"""``publish``: the history store as a static site.

    site/index.html                 the GPU models, with their open regressions
    site/regressions.html           every step and drift, the commits around it, its bisect command
    site/regressions.json           the same findings, for scripts
    site/<gpu_key>/index.html       every benchmark against its first run; benchmarks; runs
    site/<gpu_key>/<benchmark>.html one benchmark: median, spread, asv's level, findings, runs
    site/plotly.min.js              the one copy of plotly.js every page loads (offline, no CDN)

Every page is plain HTML plus plotly; it works from a file:// folder, a CI artifact or GitHub
Pages alike.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html import escape
from pathlib import Path

from plotly.offline import get_plotlyjs

from attnkit_perf.history import charts
from attnkit_perf.history.detect import Finding, Rule, detect
from attnkit_perf.history.links import CommitLinks, bisect_command, commit_anchor
from attnkit_perf.history.store import GpuHistory, Series, load_store

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #222; }
nav { background: #1f3b57; padding: 8px 20px; }
nav a { color: #fff; margin-right: 18px; text-decoration: none; font-weight: 600; }
main { padding: 8px 20px 40px; max-width: 1400px; }
table { border-collapse: collapse; margin: 8px 0 20px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #f3f5f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { background: #f3f5f7; padding: 1px 4px; font-size: 12px; }
.step { color: #b3261e; font-weight: 600; } .drift { color: #b35c00; font-weight: 600; }
.ok { color: #2e7d32; } .muted { color: #777; }
"""


@dataclass
class Analysed:
    """One series with asv's level per point and what :func:`detect` found in it."""

    series: Series
    level: list[float]
    findings: list[Finding]
    #: Whether the series had the rule's ``min_points`` runs (else nothing was looked for).
    checked: bool = True


def slug(name: str) -> str:
    """A benchmark name as a file name: ``fwd[triton-bf16-...]`` -> ``fwd-triton-bf16-...``."""
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", name).strip("-")


def analyse(history: GpuHistory, rule: Rule) -> dict[str, Analysed]:
    result = {}
    for name, series in sorted(history.series.items()):
        level, findings = detect(series.medians, rule)
        result[name] = Analysed(series, level, findings, len(series.points) >= rule.min_points)
    files = [slug(name) for name in result]
    if len(set(files)) != len(files):
        raise ValueError("two benchmark names map to one page name; rename one")
    return result


def _page(title: str, body: str, root: str, charts: bool = True) -> str:
    script = f'<script src="{root}plotly.min.js"></script>' if charts else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{escape(title)}</title>'
        f'<link rel="icon" href="data:,"><style>{CSS}</style>{script}'
        f'</head><body><nav><a href="{root}index.html">attnkit performance history</a>'
        f'<a href="{root}regressions.html">regressions</a></nav><main>{body}</main></body></html>\n'
    )


def _commit(sha: str, links: CommitLinks) -> str:
    url = links.commit_url(sha)
    text = f"<code>{escape(sha[:7])}</code>"
    return f'<a href="{escape(url)}">{text}</a>' if url else text


def _table(head: list[str], rows: list[str], css: str = "") -> str:
    heads = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f'<table class="{css}"><thead><tr>{heads}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _version_changes(series: Series, finding: Finding) -> str:
    before, after = dict(series.points[finding.good].versions), dict(series.points[finding.bad].versions)
    changed = [f"{k} {before[k]} → {after[k]}" for k in before if before[k] != after.get(k)]
    return escape("; ".join(changed)) if changed else '<span class="muted">none</span>'


def _finding_row(gpu: str, item: Analysed, finding: Finding, links: CommitLinks, root: str) -> str:
    series = item.series
    good, bad = series.points[finding.good], series.points[finding.bad]
    compare = links.compare_url(good.commit, bad.commit)
    compare_html = f' <a href="{escape(compare)}">diff</a>' if compare else ""
    page = f"{root}{gpu}/{slug(series.name)}.html"
    return (
        f'<tr class="finding" data-gpu="{escape(gpu)}" data-benchmark="{escape(series.name)}" '
        f'data-kind="{finding.kind}" data-good="{good.commit}" data-bad="{bad.commit}">'
        f'<td><a href="{escape(page)}">{escape(series.name)}</a></td>'
        f'<td class="{finding.kind}">{finding.kind}</td><td class="num">{finding.ratio - 1:+.1%}</td>'
        f"<td>{_commit(good.commit, links)} {escape(good.commit_date[:10])} → "
        f"{_commit(bad.commit, links)} {escape(bad.commit_date[:10])}{compare_html}</td>"
        f"<td>{_version_changes(series, finding)}</td>"
        f"<td><code>{escape(bisect_command(good.commit, bad.commit, series.name))}</code></td></tr>"
    )


FINDING_HEAD = [
    "benchmark",
    "kind",
    "change",
    "commits (last good → first bad)",
    "versions changed",
    "pin it",
]


def _findings_tables(gpu: str, analysed: dict[str, Analysed], links: CommitLinks, root: str) -> str:
    found = [(item, f) for item in analysed.values() for f in item.findings]
    if not found:
        return '<p class="ok">No steps or drifts.</p>'
    html = ""
    for title, persists in (("Still present", True), ("Recovered later", False)):
        rows = [_finding_row(gpu, item, f, links, root) for item, f in found if f.persists is persists]
        if rows:
            html += f"<h3>{title}</h3>" + _table(FINDING_HEAD, rows, "findings")
    return html


def _status(item: Analysed) -> str:
    open_ = [f for f in item.findings if f.persists]
    if not item.checked:
        return '<span class="muted">too few runs</span>'
    if not open_:
        return '<span class="ok">ok</span>'
    return " ".join(f'<span class="{f.kind}">{f.kind} {f.ratio - 1:+.1%}</span>' for f in open_)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _gpu_page(history: GpuHistory, analysed: dict[str, Analysed], links: CommitLinks) -> str:
    flagged = {name for name, item in analysed.items() if any(f.persists for f in item.findings)}
    overview = charts.overview_figure([a.series for a in analysed.values()], flagged)
    bench_rows = []
    for name, item in analysed.items():
        last = item.series.points[-1]
        spread = (last.q3_ms - last.q1_ms) / last.median_ms
        bench_rows.append(
            f'<tr><td><a href="{escape(slug(name))}.html">{escape(name)}</a></td>'
            f"<td>{escape(item.series.backend)}</td><td>{escape(item.series.pass_name)}</td>"
            f'<td class="num">{len(item.series.points)}</td><td class="num">{last.median_ms:.4f}</td>'
            f'<td class="num">{spread:.1%}</td><td class="num">{_num(last.tflops, ".1f")}</td>'
            f'<td class="num">{_mib(last.peak_bytes)}</td><td>{_status(item)}</td></tr>'
        )
    run_rows, anchored = [], set()
    for run in reversed(history.runs):
        anchor = commit_anchor(run["commit"])
        ident = "" if anchor in anchored else f' id="{anchor}"'
        anchored.add(anchor)
        m = run["machine"]
        run_rows.append(
            f"<tr{ident}><td>{_commit(run['commit'], links)}</td><td>{escape(run['commit_date'])}</td>"
            f"<td>{escape(run['recorded'])}</td><td>{escape(str(m.get('torch')))}</td>"
            f"<td>{escape(str(m.get('triton')))}</td><td>{escape(str(m.get('driver')))}</td>"
            f"<td>{escape(str(m.get('cuda')))}</td><td class=num>{len(run['benchmarks'])}</td></tr>"
        )
    first, last = history.runs[0], history.runs[-1]
    body = (
        f"<h1>{escape(history.device_name or history.gpu_key)}</h1>"
        f"<p>GPU key <code>{escape(history.gpu_key)}</code>: {_count(len(history.runs), 'run')}, commits "
        f"{_commit(first['commit'], links)} ({escape(first['commit_date'][:10])}) to "
        f"{_commit(last['commit'], links)} ({escape(last['commit_date'][:10])}), "
        f"{len(analysed)} benchmarks. {len(flagged)} with a step or drift still present "
        f'(<a href="../regressions.html#{escape(history.gpu_key)}">regressions</a>).</p>'
        + charts.figure_html(overview, "overview")
        + "<h2>Benchmarks</h2>"
        + _table(
            ["benchmark", "backend", "pass", "runs", "latest ms", "spread", "TFLOP/s", "peak MiB", "status"],
            bench_rows,
            "benchmarks",
        )
        + "<h2>Runs (newest first)</h2>"
        + _table(
            ["commit", "commit date", "recorded", "torch", "triton", "driver", "cuda", "benchmarks"], run_rows
        )
    )
    return _page(f"{history.gpu_key}: performance history", body, "../")


def _series_page(gpu: str, item: Analysed, links: CommitLinks) -> str:
    series = item.series
    urls = [links.commit_url(p.commit) for p in series.points]
    fig = charts.series_figure(series, item.level, item.findings, urls)
    rows = [
        f"<tr><td>{_commit(p.commit, links)}</td><td>{escape(p.commit_date)}</td>"
        f'<td class="num">{p.median_ms:.4f}</td><td class="num">{p.q1_ms:.4f} – {p.q3_ms:.4f}</td>'
        f'<td class="num">{_num(p.tflops, ".1f")}</td><td class="num">{_mib(p.peak_bytes)}</td></tr>'
        for p in reversed(series.points)
    ]
    body = (
        f"<h1>{escape(series.name)}</h1><p>{escape(gpu)} · {escape(series.backend)} · "
        f"{escape(series.pass_name)} · {_count(len(series.points), 'run')}. "
        "Click a point to open its commit.</p>"
        + charts.figure_html(fig, "series", clickable=True)
        + "<h2>Steps and drifts</h2>"
        + _findings_tables(gpu, {series.name: item}, links, "../")
        + "<h2>Runs (newest first)</h2>"
        + _table(["commit", "commit date", "median ms", "q1 – q3 ms", "TFLOP/s", "peak MiB"], rows)
    )
    return _page(f"{series.name} on {gpu}", body, "../")


def _index_page(
    histories: dict[str, GpuHistory], analysed: dict[str, dict[str, Analysed]], rule: Rule
) -> str:
    rows = []
    for key, history in histories.items():
        open_ = sum(f.persists for item in analysed[key].values() for f in item.findings)
        rows.append(
            f'<tr><td><a href="{escape(key)}/index.html">{escape(history.device_name or key)}</a></td>'
            f'<td><code>{escape(key)}</code></td><td class="num">{len(history.runs)}</td>'
            f'<td class="num">{len(analysed[key])}</td><td class="num">{open_}</td>'
            f"<td>{escape(history.runs[-1]['commit_date'][:10])}</td></tr>"
        )
    rule_text = ", ".join(f"{k} = {v}" for k, v in rule.as_dict().items())
    body = (
        "<h1>attnkit performance history</h1>"
        + _table(["GPU model", "key", "runs", "benchmarks", "open findings", "latest commit"], rows, "gpus")
        + f'<p class="muted">Detection rule (docs/HISTORY.md): {escape(rule_text)}.</p>'
    )
    return _page("attnkit performance history", body, "", charts=False)


def _regressions_page(analysed: dict[str, dict[str, Analysed]], links: CommitLinks) -> str:
    body = "<h1>Regressions: steps and drifts in GPU time</h1>"
    for key, per_gpu in analysed.items():
        body += f'<h2 id="{escape(key)}">{escape(key)}</h2>' + _findings_tables(key, per_gpu, links, "")
    return _page("attnkit performance history: regressions", body, "", charts=False)


def findings_json(analysed: dict[str, dict[str, Analysed]]) -> list[dict]:
    """Every finding as a plain dict (``regressions.json``; the ``regressions`` command)."""
    out = []
    for key, per_gpu in analysed.items():
        for name, item in per_gpu.items():
            for f in item.findings:
                good, bad = item.series.points[f.good], item.series.points[f.bad]
                out.append(
                    {"gpu_key": key, "benchmark": name, "kind": f.kind, "change": f.ratio - 1,
                     "persists": f.persists, "good": good.commit, "bad": bad.commit,
                     "bisect": bisect_command(good.commit, bad.commit, name)}
                )  # fmt: skip
    return out


def analyse_store(
    store: Path | str, rule: Rule
) -> tuple[dict[str, GpuHistory], dict[str, dict[str, Analysed]]]:
    histories = load_store(store)
    return histories, {key: analyse(history, rule) for key, history in histories.items()}


def publish(store: Path | str, out: Path | str, links: CommitLinks, rule: Rule | None = None) -> Path:
    """Write the site for ``store`` into ``out`` (created; pages already there are replaced)."""
    rule = rule or Rule.load()
    histories, analysed = analyse_store(store, rule)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plotly.min.js").write_text(get_plotlyjs(), encoding="utf8")
    (out / "index.html").write_text(_index_page(histories, analysed, rule), encoding="utf8")
    (out / "regressions.html").write_text(_regressions_page(analysed, links), encoding="utf8")
    (out / "regressions.json").write_text(
        json.dumps(findings_json(analysed), indent=1) + "\n", encoding="utf8"
    )
    for key, history in histories.items():
        folder = out / key
        folder.mkdir(exist_ok=True)
        (folder / "index.html").write_text(_gpu_page(history, analysed[key], links), encoding="utf8")
        for name, item in analysed[key].items():
            (folder / f"{slug(name)}.html").write_text(_series_page(key, item, links), encoding="utf8")
    return out / "index.html"
