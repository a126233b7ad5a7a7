"""The drift report: every day of `representation_drift` as charts over days and one table per day."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path

from jobs.eval.report import publish_report, svg_line_chart

COSINE_CHART = "drift_cosine.svg"
KEPT_CHART = "drift_tokens_kept.svg"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def day_series(rows: Sequence[Mapping], column: str, cohort: str) -> dict[str, list[tuple[float, float]]]:
    """entity type -> (days since the first day, value) of one column and cohort."""
    days = sorted({r["ds"] for r in rows})
    first = days[0] if days else dt.date.today()
    series: dict[str, list[tuple[float, float]]] = {}
    for r in sorted(rows, key=lambda r: (r["entity_type"], r["ds"])):
        if r["cohort"] == cohort and r.get(column) is not None:
            series.setdefault(r["entity_type"], []).append(((r["ds"] - first).days, float(r[column])))
    return series


def render(rows: Sequence[Mapping], max_drift: float | None) -> str:
    days = sorted({r["ds"] for r in rows})
    lines = [
        "# Representation drift",
        "",
        f"Days {days[0]} to {days[-1]}: each day against the previous day embedded. An entity is *unchanged* when "
        "its neighbourhood sample holds the same neighbour ids on both days; a ranking model trained on yesterday's "
        "features may expect the changed ones to move, not the unchanged ones. Drift = 1 - median cosine among the "
        "unchanged"
        + (
            f"; the day fails above {max_drift:g}."
            if max_drift is not None
            else "; no threshold set (--max-drift)."
        ),
        "",
        f"![Median cosine to the previous day, unchanged entities]({COSINE_CHART})",
        "",
        f"![Level-0 token kept, unchanged entities]({KEPT_CHART})",
        "",
    ]
    header = (
        "| entity type | cohort | entities | cosine mean | p10 | median | p90 | overlap@10 | level-0 kept | "
        "level-1 kept |"
    )
    for day in reversed(days):
        today = [r for r in rows if r["ds"] == day]
        versions = sorted({(r["previous_model_version"], r["model_version"]) for r in today})
        lines += [
            f"## {day} (against {today[0]['previous_ds']})",
            "",
            "Models: " + "; ".join(f"{a} -> {b}" for a, b in versions),
            "",
            header,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sorted(today, key=lambda r: (r["entity_type"], r["cohort"])):
            lines.append(
                f"| {r['entity_type']} | {r['cohort']} | {r['entities']} | {_fmt(r['cosine_mean'])} | "
                f"{_fmt(r['cosine_p10'])} | {_fmt(r['cosine_p50'])} | {_fmt(r['cosine_p90'])} | "
                f"{_fmt(r['overlap_at_10'])} | {_fmt(r['level0_kept'])} | {_fmt(r['level1_kept'])} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def write_drift_report(folder: str | Path, rows: Sequence[Mapping], max_drift: float | None) -> str:
    """report.md with two charts over days (median cosine and level-0 token kept, unchanged cohort)."""
    first = min(r["ds"] for r in rows)
    x_label = f"days since {first}"
    charts = {
        COSINE_CHART: svg_line_chart(
            day_series(rows, "cosine_p50", "unchanged"),
            title="Median cosine to the previous day (unchanged neighbourhoods)",
            x_label=x_label,
            y_label="cosine",
        ),
        KEPT_CHART: svg_line_chart(
            day_series(rows, "level0_kept", "unchanged"),
            title="Level-0 token kept (unchanged neighbourhoods)",
            x_label=x_label,
            y_label="share kept",
        ),
    }
    return publish_report(folder, charts, render(rows, max_drift))
