"""The dashboard's charts: plotly figures, rendered in the browser by the one ``plotly.min.js``
the site carries (no CDN: the pages work offline and on an air-gapped runner).

x is the run's position in commit-date order (ticks name the commit), so runs days apart and
runs minutes apart are spaced alike and a step sits between two named commits.
"""

from __future__ import annotations

import statistics

import plotly.graph_objects as go
import plotly.io as pio

from attnkit_perf.history.detect import Finding
from attnkit_perf.history.store import Series

#: The overview's reference: the median of this many first runs of each benchmark.
REFERENCE_RUNS = 5
#: Shading of a finding's commits on a chart.
FINDING_COLOURS = {"step": "rgba(214, 39, 40, 0.22)", "drift": "rgba(255, 127, 14, 0.22)"}
#: Opens the clicked run's commit (customdata[0] holds its URL, empty when there is none).
CLICK_SCRIPT = (
    "var plot = document.getElementById('{plot_id}');"
    "plot.on('plotly_click', function (ev) {"
    " var url = ev.points[0].customdata && ev.points[0].customdata[0]; if (url) window.open(url); });"
)


def _ticks(series: Series, count: int = 12) -> dict:
    every = max(1, len(series.points) // count)
    keep = list(range(0, len(series.points), every))
    return {"tickvals": keep, "ticktext": [series.points[k].short for k in keep], "tickangle": -45}


def _layout(title: str, yaxis: str, height: int) -> dict:
    return {
        "title": {"text": title, "font": {"size": 15}},
        "yaxis": {"title": {"text": yaxis}, "zeroline": False},
        "height": height,
        "margin": {"l": 70, "r": 20, "t": 50, "b": 70},
        "legend": {"orientation": "h", "y": -0.28},
        "hovermode": "closest",
        "template": "plotly_white",
    }


def series_figure(series: Series, level: list[float], findings: list[Finding], urls: list[str]) -> go.Figure:
    """Median per run, its round-to-round spread (q1-q3) as the band, asv's level as a dashed
    step line, and each finding's commits shaded. ``urls``: one commit URL (or "") per point."""
    points = series.points
    x = list(range(len(points)))
    custom = [
        [url, p.short, p.commit_date[:10], dict(p.versions).get("torch"), dict(p.versions).get("triton")]
        for url, p in zip(urls, points, strict=True)
    ]
    hover = (
        "commit %{customdata[1]} (%{customdata[2]})<br>median %{y:.4f} ms<br>"
        "torch %{customdata[3]}, triton %{customdata[4]}<extra></extra>"
    )
    fig = go.Figure()
    fig.add_scatter(
        x=x,
        y=[p.q3_ms for p in points],
        mode="lines",
        line={"width": 0},
        hoverinfo="skip",
        showlegend=False,
        name="q3",
    )
    fig.add_scatter(
        x=x,
        y=[p.q1_ms for p in points],
        mode="lines",
        line={"width": 0},
        fill="tonexty",
        fillcolor="rgba(31, 119, 180, 0.18)",
        hoverinfo="skip",
        name="spread of the rounds (q1-q3)",
    )
    fig.add_scatter(
        x=x,
        y=[p.median_ms for p in points],
        mode="lines+markers",
        name="median per call",
        customdata=custom,
        hovertemplate=hover,
        line={"color": "rgb(31, 119, 180)"},
    )
    fig.add_scatter(
        x=x,
        y=level,
        mode="lines",
        name="level (asv step fit)",
        hoverinfo="skip",
        line={"dash": "dash", "color": "rgb(90, 90, 90)", "shape": "hv"},
    )
    for finding in findings:
        fig.add_vrect(
            x0=finding.good,
            x1=finding.bad,
            fillcolor=FINDING_COLOURS[finding.kind],
            line_width=0,
            annotation_text=f"{finding.kind} {finding.ratio - 1:+.1%}",
            annotation_position="top left",
        )
    clock = "GPU" if series.clock == "gpu" else "host"
    fig.update_layout(**_layout(series.name, f"ms per call ({clock} time)", 420))
    fig.update_xaxes(**_ticks(series))
    return fig


def overview_figure(all_series: list[Series], flagged: set[str]) -> go.Figure:
    """Every benchmark's median relative to the median of its first :data:`REFERENCE_RUNS` runs
    (one odd first run does not offset the whole line): which moved, and together or alone.
    Flagged benchmarks are drawn bold; the rest thin and grey."""
    fig = go.Figure()
    longest = max(all_series, key=lambda s: len(s.points))
    for series in sorted(all_series, key=lambda s: s.name in flagged):
        first = statistics.median(series.medians[:REFERENCE_RUNS])
        bold = series.name in flagged
        fig.add_scatter(
            x=list(range(len(series.points))),
            y=[p.median_ms / first - 1 for p in series.points],
            mode="lines+markers",
            marker={"size": 4},
            name=series.name,
            showlegend=bold,
            line={"width": 2.5 if bold else 1, **({} if bold else {"color": "rgba(120, 120, 120, 0.35)"})},
            hovertemplate=f"{series.name}<br>%{{y:+.1%}} vs its first runs<extra></extra>",
        )
    fig.update_layout(
        **_layout(f"Every benchmark against its first {REFERENCE_RUNS} runs", "change of the median", 460)
    )
    fig.update_yaxes(tickformat="+.0%")
    fig.update_xaxes(**_ticks(longest))
    return fig


def figure_html(fig: go.Figure, plot_id: str, clickable: bool = False) -> str:
    """The figure as a ``<div>`` and the script that draws it with the page's plotly.js."""
    return pio.to_html(
        fig,
        include_plotlyjs=False,
        full_html=False,
        div_id=plot_id,
        config={"displaylogo": False, "responsive": True},
        post_script=CLICK_SCRIPT if clickable else None,
    )
