"""The evaluation report: Markdown tables with confidence intervals, hand-written SVG charts, a console table.

Result rows (one per dataset, protocol, method, candidate set, slice, metric and K) have the keys dataset,
protocol, model_version, method, candidates, slice, metric ('recall', 'ndcg', 'hit_rate'), k, value, ci_low,
ci_high and num_users. Methods whose name starts with `hir` are HIR (`hir`) and its ablations (`hir_no_bias`,
...); every other method is a baseline, and HIR's lift is measured against the best of those.

Charts are plain SVG strings (no plotting dependency): `svg_line_chart` for metric@K curves, `svg_bar_chart` for
grouped bars such as token usage per quantiser level. `write_report` writes the Markdown and the charts into one
folder.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from xml.sax.saxutils import escape, quoteattr

from hir_model import storage

# Okabe-Ito's colour-blind-safe palette (black last: it reads as an axis) plus two of Paul Tol's muted colours.
PALETTE = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#882255",
    "#44AA99",
    "#F0E442",
    "#000000",
)
# Dash patterns tell apart series that share a colour (a second pass through the palette, or a second candidate set).
DASHES = ("", "6 3", "2 3", "8 3 2 3")

METRIC_LABELS = {"recall": "Recall", "ndcg": "NDCG", "hit_rate": "HitRate"}
TABLE_METRICS = ("recall", "ndcg", "hit_rate")
# Retrieval rows on a baseline's method: HIR minus that baseline, paired over users (jobs.evaluate.hir_differences).
DIFF_METRICS = {"recall": "hir_recall_diff", "ndcg": "hir_ndcg_diff"}
REPORT_FILE = "report.md"
RECALL_CHART = "recall_at_k.svg"
NDCG_CHART = "ndcg_at_k.svg"
TOKEN_CHART = "token_usage.svg"
LIFT_CHART = "ranking_lift.svg"
IMPORTANCE_CHART = "ranking_importance.svg"
RANKERS = ("base", "base+hir_embedding", "base+hir_tokens", "base+hir")

_FONT = 'font-family="Helvetica, Arial, sans-serif"'
_CHAR_WIDTH = 6.6  # average glyph width of 12 px sans-serif, for sizing the legend


def is_hir(method: str) -> bool:
    """HIR and its ablations; every other method is a baseline."""
    return method.startswith("hir")


def best_baseline(values: Mapping[str, float]) -> str | None:
    """The baseline (not HIR nor an ablation) with the highest value, ties to the first name; None if there is none."""
    baselines = sorted(m for m in values if not is_hir(m))
    return max(baselines, key=values.__getitem__) if baselines else None


# --- SVG ------------------------------------------------------------------------------------------------------------


def _fmt_num(value: float) -> str:
    """Compact coordinate text."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _tick_label(value: float) -> str:
    return f"{value:.6g}"


def nice_ticks(low: float, high: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        high = low + 1.0 if math.isfinite(low) else 1.0
        low = low if math.isfinite(low) else 0.0
    raw_step = (high - low) / max(1, target)
    magnitude = 10 ** math.floor(math.log10(raw_step))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw_step)
    first = math.floor(low / step + 1e-9) * step
    last = math.ceil(high / step - 1e-9) * step
    count = int(round((last - first) / step))
    return [round(first + i * step, 12) for i in range(count + 1)]


def _svg_open(width: int, height: int, title: str) -> list[str]:
    return [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" {_FONT} font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.1f}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
        f"{escape(title)}</text>",
    ]


def _y_axis(
    ticks: list[float], y_of, left: float, right: float, top: float, bottom: float, label: str
) -> list[str]:
    parts = []
    for tick in ticks:
        y = y_of(tick)
        parts.append(
            f'<line x1="{_fmt_num(left)}" y1="{_fmt_num(y)}" x2="{_fmt_num(right)}" y2="{_fmt_num(y)}" '
            'stroke="#e5e5e5" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{_fmt_num(left - 6)}" y="{_fmt_num(y + 4)}" text-anchor="end">{escape(_tick_label(tick))}</text>'
        )
    middle = (top + bottom) / 2
    parts.append(
        f'<text x="16" y="{_fmt_num(middle)}" text-anchor="middle" transform="rotate(-90 16 {_fmt_num(middle)})">'
        f"{escape(label)}</text>"
    )
    parts.append(
        f'<line x1="{_fmt_num(left)}" y1="{_fmt_num(top)}" x2="{_fmt_num(left)}" y2="{_fmt_num(bottom)}" '
        'stroke="#333333"/>'
    )
    parts.append(
        f'<line x1="{_fmt_num(left)}" y1="{_fmt_num(bottom)}" x2="{_fmt_num(right)}" y2="{_fmt_num(bottom)}" '
        'stroke="#333333"/>'
    )
    return parts


def _legend(entries: list[tuple[str, str, str, bool]], x: float, y: float) -> list[str]:
    """entries: (name, colour, dash, as_line); a line sample for line charts, a square for bars."""
    parts = ['<g class="legend">']
    for row, (name, colour, dash, as_line) in enumerate(entries):
        cy = y + row * 18
        if as_line:
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            parts.append(
                f'<line x1="{_fmt_num(x)}" y1="{_fmt_num(cy)}" x2="{_fmt_num(x + 22)}" y2="{_fmt_num(cy)}" '
                f'stroke="{colour}" stroke-width="2"{dash_attr}/>'
            )
            parts.append(f'<circle cx="{_fmt_num(x + 11)}" cy="{_fmt_num(cy)}" r="3" fill="{colour}"/>')
        else:
            parts.append(
                f'<rect x="{_fmt_num(x + 5)}" y="{_fmt_num(cy - 6)}" width="12" height="12" fill="{colour}"/>'
            )
        parts.append(f'<text x="{_fmt_num(x + 28)}" y="{_fmt_num(cy + 4)}">{escape(name)}</text>')
    parts.append("</g>")
    return parts


def _legend_width(names: Iterable[str]) -> float:
    return 28 + _CHAR_WIDTH * max((len(n) for n in names), default=0) + 12


def _legend_height(entries: int) -> int:
    """The chart height that keeps every legend row inside the picture."""
    return int(48 + 18 * entries + 16)


def series_style(index: int) -> tuple[str, str]:
    """(colour, dash) for the index-th series: the palette, then the palette again dashed."""
    return PALETTE[index % len(PALETTE)], DASHES[(index // len(PALETTE)) % len(DASHES)]


def svg_line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 720,
    height: int = 420,
    categorical_x: bool = True,
    styles: Mapping[str, tuple[str, str]] | None = None,
) -> str:
    """A standalone SVG document with one polyline and its markers per series, axes, ticks and a legend.

    Parameters
    ----------
    series : name -> (x, y) points; drawn in the given order, points sorted by x.
    categorical_x : place the distinct x values (e.g. K = 10, 20, 50, 100) evenly, labelled by value; otherwise
        use a linear x axis.
    styles : name -> (colour, dash pattern) for series that should match across charts; the rest follow the
        palette in order.
    """
    names = list(series)
    points = {name: sorted((float(x), float(y)) for x, y in series[name]) for name in names}
    xs = sorted({x for pts in points.values() for x, _ in pts})
    ys = [y for pts in points.values() for _, y in pts if math.isfinite(y)]

    height = max(height, _legend_height(len(names)))
    left, top = 64.0, 40.0
    right = width - max(24.0, _legend_width(names))
    bottom = height - 52.0
    y_ticks = nice_ticks(min([0.0, *ys]), max(ys, default=1.0) or 1.0)
    y_low, y_high = y_ticks[0], y_ticks[-1]

    def y_of(y: float) -> float:
        return bottom - (y - y_low) / (y_high - y_low) * (bottom - top)

    if categorical_x:
        slot = {x: i for i, x in enumerate(xs)}
        gap = (right - left) / max(1, len(xs))

        def x_of(x: float) -> float:
            return left + gap * (slot[x] + 0.5)

        x_ticks = xs
    else:
        x_ticks = nice_ticks(min(xs, default=0.0), max(xs, default=1.0))

        def x_of(x: float) -> float:
            return left + (x - x_ticks[0]) / (x_ticks[-1] - x_ticks[0]) * (right - left)

    parts = _svg_open(width, height, title)
    parts += _y_axis(y_ticks, y_of, left, right, top, bottom, y_label)
    for x in x_ticks:
        px = x_of(x)
        parts.append(
            f'<line x1="{_fmt_num(px)}" y1="{_fmt_num(bottom)}" x2="{_fmt_num(px)}" y2="{_fmt_num(bottom + 5)}" '
            'stroke="#333333"/>'
        )
        parts.append(
            f'<text x="{_fmt_num(px)}" y="{_fmt_num(bottom + 18)}" text-anchor="middle">'
            f"{escape(_tick_label(x))}</text>"
        )
    parts.append(
        f'<text x="{_fmt_num((left + right) / 2)}" y="{height - 12}" text-anchor="middle">{escape(x_label)}</text>'
    )
    if not names:
        parts.append(
            f'<text x="{_fmt_num((left + right) / 2)}" y="{_fmt_num((top + bottom) / 2)}" text-anchor="middle" '
            'fill="#777777">no data</text>'
        )

    legend = []
    for index, name in enumerate(names):
        colour, dash = (styles or {}).get(name) or series_style(index)
        drawn = [(x_of(x), y_of(y)) for x, y in points[name] if math.isfinite(y)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        coords = " ".join(f"{_fmt_num(px)},{_fmt_num(py)}" for px, py in drawn)
        parts.append(f'<g class="series" data-name={quoteattr(name)}>')
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr} '
            'stroke-linejoin="round"/>'
        )
        for (px, py), (x, y) in zip(drawn, [p for p in points[name] if math.isfinite(p[1])], strict=True):
            parts.append(
                f'<circle cx="{_fmt_num(px)}" cy="{_fmt_num(py)}" r="3.5" fill="{colour}">'
                f"<title>{escape(f'{name}: {_tick_label(x)} -> {y:.4f}')}</title></circle>"
            )
        parts.append("</g>")
        legend.append((name, colour, dash, True))
    parts += _legend(legend, right + 14, top + 8)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def svg_bar_chart(
    groups: Mapping[str, Mapping[str, float]],
    *,
    title: str,
    y_label: str,
    width: int = 720,
    height: int = 420,
    y_max: float | None = None,
) -> str:
    """A standalone SVG document with grouped bars: one cluster per group, one coloured bar per series.

    Parameters
    ----------
    groups : group (x axis, e.g. 'level 1') -> series name (e.g. 'codes used share') -> value. Series keep the
        order of their first appearance; a series missing from a group leaves a gap.
    y_max : fix the top of the axis (e.g. 1.0 for shares); by default it is rounded up from the largest value.
    """
    group_names = list(groups)
    bar_names = list(dict.fromkeys(name for bars in groups.values() for name in bars))
    values = [float(v) for bars in groups.values() for v in bars.values() if math.isfinite(float(v))]

    height = max(height, _legend_height(len(bar_names)))
    left, top = 64.0, 40.0
    right = width - max(24.0, _legend_width(bar_names))
    bottom = height - 52.0
    y_ticks = nice_ticks(
        min([0.0, *values]), y_max if y_max is not None else (max(values, default=1.0) or 1.0)
    )
    y_low, y_high = y_ticks[0], y_ticks[-1]

    def y_of(y: float) -> float:
        return bottom - (y - y_low) / (y_high - y_low) * (bottom - top)

    parts = _svg_open(width, height, title)
    parts += _y_axis(y_ticks, y_of, left, right, top, bottom, y_label)
    cluster = (right - left) / max(1, len(group_names))
    bar_width = cluster * 0.8 / max(1, len(bar_names))
    zero = y_of(max(y_low, 0.0))
    for g, group in enumerate(group_names):
        start = left + cluster * g + cluster * 0.1
        parts.append(f'<g class="group" data-name={quoteattr(group)}>')
        for b, bar in enumerate(bar_names):
            value = groups[group].get(bar)
            if value is None or not math.isfinite(float(value)):
                continue
            y = y_of(float(value))
            parts.append(
                f'<rect x="{_fmt_num(start + b * bar_width)}" y="{_fmt_num(min(y, zero))}" '
                f'width="{_fmt_num(bar_width * 0.92)}" height="{_fmt_num(abs(zero - y))}" '
                f'fill="{PALETTE[b % len(PALETTE)]}"><title>{escape(f"{group}, {bar}: {float(value):.4f}")}</title>'
                "</rect>"
            )
        parts.append("</g>")
        parts.append(
            f'<text x="{_fmt_num(start + cluster * 0.4)}" y="{_fmt_num(bottom + 18)}" text-anchor="middle">'
            f"{escape(group)}</text>"
        )
    legend = [(bar, PALETTE[b % len(PALETTE)], "", False) for b, bar in enumerate(bar_names)]
    parts += _legend(legend, right + 14, top + 8)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# --- Markdown and console -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankingSection:
    """The ranking task's part of the report: its rows (task ranking), feature-group importance per ranker, and
    facts about the candidates, folds and boosting."""

    rows: Sequence[Mapping]
    importance: Mapping[str, Mapping[str, float]]
    context: Mapping[str, object]


def _ranking_index(rows: Sequence[Mapping]) -> dict[tuple, Mapping]:
    return {(r["method"], r["slice"], r["metric"], r["k"]): r for r in rows}


def _base_ndcg(index: Mapping[tuple, Mapping], slice_: str, k: int) -> float | None:
    """base's NDCG@k on the slice, None without it or at zero (no relative lift is defined then)."""
    base = index.get(("base", slice_, "ndcg", k))
    return base["value"] if base is not None and base["value"] else None


def _lift_and_base(rows: Sequence[Mapping], ranker: str, slice_: str, k: int) -> tuple[Mapping, float] | None:
    """The ranker's NDCG@k lift row over base and base's NDCG@k, or None without either."""
    index = _ranking_index(rows)
    lift, base = index.get((ranker, slice_, "ndcg_lift", k)), _base_ndcg(index, slice_, k)
    return None if lift is None or base is None else (lift, base)


def relative_lift(rows: Sequence[Mapping], ranker: str, slice_: str, k: int = 10) -> float | None:
    """The ranker's NDCG@k lift over base relative to base's NDCG@k (0.05 = +5%), or None."""
    found = _lift_and_base(rows, ranker, slice_, k)
    return None if found is None else found[0]["value"] / found[1]


def detectable_lift(
    rows: Sequence[Mapping], ranker: str, slice_: str, k: int = 10, *, power: float = 0.8, alpha: float = 0.05
) -> float | None:
    """The smallest NDCG@k lift over base, relative to base's NDCG@k, that these users detect with `power`.

    The paired test's minimum detectable effect: (z(1 - alpha/2) + z(power)) standard errors of the paired
    difference, the standard error read from the width of its (1 - alpha) bootstrap interval. A lift goal below
    it cannot be shown on these users whatever the features do (0.29 = a true +29% is found 80% of the time).
    None without the lift row or a base above zero.
    """
    found = _lift_and_base(rows, ranker, slice_, k)
    if found is None:
        return None
    lift, base = found
    z_ci = NormalDist().inv_cdf(1 - alpha / 2)
    standard_error = (lift["ci_high"] - lift["ci_low"]) / (2 * z_ci)
    return (z_ci + NormalDist().inv_cdf(power)) * standard_error / base


def lift_ceiling(rows: Sequence[Mapping], slice_: str, k: int = 10) -> float | None:
    """The largest relative NDCG@k lift over base that any ranker could reach, (1 - base) / base (an NDCG is at
    most 1): 0.008 where base already scores 0.992. None without a base above zero."""
    base = _base_ndcg(_ranking_index(rows), slice_, k)
    return None if base is None else (1.0 - base) / base


def union_recall_row(rows: Sequence[Mapping], slice_: str) -> Mapping | None:
    """The candidate union's recall row of a slice (its k is each generator's list length), or None."""
    wanted = ("candidate_union", slice_, "recall")
    return next((r for r in rows if (r["method"], r["slice"], r["metric"]) == wanted), None)


def render_ranking(section: RankingSection) -> list[str]:
    """Markdown lines: context, per slice a table of the rankers, the importance table."""
    index = _ranking_index(section.rows)
    slices = list(dict.fromkeys(r["slice"] for r in section.rows if r["method"] in RANKERS))
    lines = [
        "## Ranking task: LightGBM lambdarank over the candidate union, user-disjoint folds",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in section.context.items()]
    lines.append("")
    for slice_ in slices:
        union = union_recall_row(section.rows, slice_)
        lines += [f"### Slice: {slice_}", ""]
        if union:
            lines += [
                f"Candidate recall (the ceiling of every ranker): "
                f"{format_ci(union['value'], union['ci_low'], union['ci_high'])}, {union['num_users']} users.",
                "",
            ]
        lines += [
            "| Ranker | NDCG@10 | NDCG@50 | Recall@50 | AUC | ΔNDCG@10 vs base [95% CI] | relative "
            "| detectable (80% power) |",
            "|---|---|---|---|---|---|---:|---:|",
        ]
        for ranker in RANKERS:
            if (ranker, slice_, "ndcg", 10) not in index:
                continue
            cells = []
            for metric, k in (("ndcg", 10), ("ndcg", 50), ("recall", 50), ("auc", 0)):
                row = index.get((ranker, slice_, metric, k))
                cells.append(
                    format_ci(row["value"], row["ci_low"], row["ci_high"]) if _finite(row) else "n/a"
                )
            lift = index.get((ranker, slice_, "ndcg_lift", 10))
            relative = relative_lift(section.rows, ranker, slice_)
            cells.append(format_ci(lift["value"], lift["ci_low"], lift["ci_high"]) if lift else "")
            cells.append(f"{relative:+.1%}" if relative is not None else "")
            detectable = detectable_lift(section.rows, ranker, slice_)
            cells.append(f"±{detectable:.1%}" if detectable is not None else "")
            lines.append(f"| `{ranker}` | " + " | ".join(cells) + " |")
        lines.append("")
    groups = list(dict.fromkeys(g for shares in section.importance.values() for g in shares))
    if groups:
        lines += [
            "### Feature importance (share of LightGBM gain, summed over folds)",
            "",
            "| Ranker | " + " | ".join(groups) + " |",
            "|---|" + "---:|" * len(groups),
        ]
        for ranker, shares in section.importance.items():
            lines.append(
                f"| `{ranker}` | "
                + " | ".join(f"{shares[g]:.1%}" if g in shares else "" for g in groups)
                + " |"
            )
        lines.append("")
    return lines


def ranking_charts(section: RankingSection) -> dict[str, str]:
    """Relative NDCG@10 lift of each HIR ranker per slice, and feature-group importance per ranker."""
    slices = list(dict.fromkeys(r["slice"] for r in section.rows if r["metric"] == "ndcg_lift"))
    lift = {
        slice_: {
            ranker: 100.0 * value
            for ranker in RANKERS[1:]
            if (value := relative_lift(section.rows, ranker, slice_)) is not None
        }
        for slice_ in slices
    }
    charts = {}
    if any(lift.values()):
        charts[LIFT_CHART] = svg_bar_chart(
            lift, title="NDCG@10 lift over the base ranker", y_label="relative lift (%)"
        )
    groups = list(dict.fromkeys(g for shares in section.importance.values() for g in shares))
    if groups:
        charts[IMPORTANCE_CHART] = svg_bar_chart(
            {g: {r: shares.get(g, 0.0) for r, shares in section.importance.items()} for g in groups},
            title="Feature importance by group (share of gain)",
            y_label="share of gain",
            y_max=1.0,
        )
    return charts


def ranking_console(rows: Sequence[Mapping]) -> str:
    """One line per ranker on slice all: NDCG@10, NDCG@50 and the NDCG@10 lift over base with its CI."""
    index = _ranking_index(rows)
    lines = ["ranking task (slice all):"]
    for ranker in RANKERS:
        ndcg10, ndcg50 = index.get((ranker, "all", "ndcg", 10)), index.get((ranker, "all", "ndcg", 50))
        if ndcg10 is None:
            continue
        text = f"  {ranker:<20} NDCG@10 {ndcg10['value']:.4f}"
        if ndcg50 is not None:
            text += f"  NDCG@50 {ndcg50['value']:.4f}"
        lift = index.get((ranker, "all", "ndcg_lift", 10))
        relative = relative_lift(rows, ranker, "all")
        if lift is not None and relative is not None:
            text += f"  lift {lift['value']:+.4f} [{lift['ci_low']:+.4f}, {lift['ci_high']:+.4f}] ({relative:+.1%}"
            detectable = detectable_lift(rows, ranker, "all")
            text += f"; detectable ±{detectable:.0%})" if detectable is not None else ")"
        lines.append(text)
    return "\n".join(lines)


def format_ci(value: float, low: float, high: float, *, bold: bool = False) -> str:
    """`0.123 [0.101, 0.145]`; the value in bold when asked; `n/a` for a missing value."""
    if value is None or not math.isfinite(value):
        return "n/a"
    shown = f"**{value:.3f}**" if bold else f"{value:.3f}"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return shown
    return f"{shown} [{low:.3f}, {high:.3f}]"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _ordered_methods(methods: Iterable[str]) -> list[str]:
    """`hir`, its ablations, then the baselines, each alphabetically."""
    unique = set(methods)
    return sorted(unique, key=lambda m: (m != "hir", not is_hir(m), m))


def _sections(results: Sequence[Mapping]) -> list[tuple]:
    """(dataset, protocol, candidates, slice) in order of first appearance."""
    return list(dict.fromkeys((r["dataset"], r["protocol"], r["candidates"], r["slice"]) for r in results))


def _index(results: Sequence[Mapping]) -> dict[tuple, Mapping]:
    return {
        (r["dataset"], r["protocol"], r["candidates"], r["slice"], r["method"], r["metric"], int(r["k"])): r
        for r in results
    }


def _finite(row: Mapping | None) -> bool:
    return row is not None and row["value"] is not None and math.isfinite(row["value"])


def lift_line(rows_by_method: Mapping[str, Mapping[str, Mapping]], *, k: int) -> str:
    """HIR's absolute and relative lift over the best baseline, per metric.

    rows_by_method: method -> metric -> result row (one section, one K).
    """
    pieces = []
    for metric in ("recall", "ndcg"):
        label = f"{METRIC_LABELS[metric]}@{k}"
        baselines = {
            m: rows[metric]
            for m, rows in rows_by_method.items()
            if not is_hir(m) and _finite(rows.get(metric))
        }
        hir_row = rows_by_method.get("hir", {}).get(metric)
        if not baselines or not _finite(hir_row):
            missing = "no baseline" if not baselines else "no `hir` result"
            pieces.append(f"{label}: {missing}")
            continue
        best = best_baseline({m: row["value"] for m, row in baselines.items()})
        base, ours = baselines[best]["value"], hir_row["value"]
        relative = f"{(ours - base) / base * 100:+.1f}%" if base > 0 else "n/a (baseline is 0)"
        paired = rows_by_method[best].get(DIFF_METRICS[metric])
        ci = f" [{paired['ci_low']:+.3f}, {paired['ci_high']:+.3f}]" if _finite(paired) else ""
        pieces.append(f"{label} {ours:.3f} vs `{best}` {base:.3f}: {ours - base:+.3f}{ci} ({relative})")
    return (
        "Lift of `hir` over the best baseline (paired 95% CI over the same users where measured) — "
        + "; ".join(pieces)
        + "."
    )


def ablation_pieces(diffs: Mapping[str, Mapping[str, Mapping | None]], *, k: int) -> list[tuple[str, str]]:
    """(ablation, "Recall@k +x [lo, hi], NDCG@k ...") for each of HIR's ablations among `diffs` (method -> the
    `hir_<metric>_diff` rows stored on that method, by metric name) that has paired differences."""
    out = []
    for method, rows in diffs.items():
        if method == "hir" or not is_hir(method):
            continue
        parts = [
            f"{METRIC_LABELS[metric]}@{k} {format_diff(row)}"
            for metric in ("recall", "ndcg")
            if _finite(row := rows.get(DIFF_METRICS[metric]))
        ]
        if parts:
            out.append((method, ", ".join(parts)))
    return out


def ablation_line(rows_by_method: Mapping[str, Mapping[str, Mapping]], *, k: int) -> str | None:
    """`hir` minus each of its ablations, paired over the same users, per metric: whether the component an
    ablation removes earns its place (its CI above zero) or not. None when the section has no ablation."""
    pieces = ablation_pieces(rows_by_method, k=k)
    if not pieces:
        return None
    return (
        "`hir` minus each ablation (paired 95% CI over the same users; bold where the CI is above zero, so the "
        "removed component earns its place) — " + "; ".join(f"`{m}` {text}" for m, text in pieces) + "."
    )


def format_diff(row: Mapping) -> str:
    """+0.012 [-0.003, +0.027], bold where the whole CI is above zero."""
    above = "**" if row["ci_low"] > 0 else ""
    return f"{above}{row['value']:+.3f}{above} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"


def render_markdown(
    results: Sequence[Mapping],
    *,
    title: str,
    context: Mapping[str, str | int | float],
    notes: Sequence[str] = (),
    plots: Mapping[str, str] | None = None,
    k: int = 50,
) -> str:
    """The report as Markdown: context table, one table per (candidates, slice), lift lines, plots, notes.

    Dataset and protocol are named in a section's heading only when the results hold more than one of them.
    """
    lines = [f"# {title}", "", "| | |", "|---|---|"]
    lines += [f"| {_cell(key)} | {_cell(value)} |" for key, value in context.items()]
    lines.append("")

    index = _index(results)
    sections = _sections(results)
    several = len({(d, p) for d, p, _, _ in sections}) > 1
    header = " | ".join(f"{METRIC_LABELS[m]}@{k} [95% CI]" for m in TABLE_METRICS)
    for dataset, protocol, candidates, slice_ in sections:
        heading = f"Candidates: {candidates} · slice: {slice_}"
        if several:
            heading = f"{dataset} ({protocol}) · {heading}"
        methods = _ordered_methods(
            r["method"]
            for r in results
            if (r["dataset"], r["protocol"], r["candidates"], r["slice"])
            == (dataset, protocol, candidates, slice_)
        )
        rows_by_method = {
            method: {
                metric: index.get((dataset, protocol, candidates, slice_, method, metric, k))
                for metric in (*TABLE_METRICS, *DIFF_METRICS.values())
            }
            for method in methods
        }
        # Bold every value that displays as the column's best, so equal-looking numbers are treated alike.
        best = {}
        for metric in TABLE_METRICS:
            shown = [
                round(rows[metric]["value"], 3)
                for rows in rows_by_method.values()
                if _finite(rows.get(metric))
            ]
            best[metric] = max(shown, default=None)

        lines += [
            f"## {heading}",
            "",
            f"| Method | {header} | Users |",
            "|---|" + "---|" * len(TABLE_METRICS) + "---:|",
        ]
        for method, rows in rows_by_method.items():
            cells = []
            for metric in TABLE_METRICS:
                row = rows[metric]
                if not _finite(row):
                    cells.append("n/a")
                    continue
                is_best = best[metric] is not None and round(row["value"], 3) == best[metric]
                cells.append(format_ci(row["value"], row.get("ci_low"), row.get("ci_high"), bold=is_best))
            users = next((r["num_users"] for r in rows.values() if r is not None), "")
            lines.append(f"| `{_cell(method)}` | " + " | ".join(cells) + f" | {users} |")
        lines += ["", lift_line(rows_by_method, k=k), ""]
        if ablations := ablation_line(rows_by_method, k=k):
            lines += [ablations, ""]

    for name, file_name in (plots or {}).items():
        lines += [f"![{_cell(name)}]({file_name})", ""]
    if notes:
        lines += ["## Notes", ""]
        lines += [f"- {note}" for note in notes]
        lines.append("")
    return "\n".join(lines)


def console_table(results: Sequence[Mapping], *, k: int = 50) -> str:
    """Fixed-width text, one block per candidate set: a row per method, a (recall@k, ndcg@k) pair per slice."""
    index = _index(results)
    sections = _sections(results)
    method_width = max([len("method"), *(len(r["method"]) for r in results)]) + 2
    blocks = list(dict.fromkeys((d, p, c) for d, p, c, _ in sections))
    several = len({(d, p) for d, p, _ in blocks}) > 1

    def value(section: tuple, method: str, metric: str) -> str:
        row = index.get((*section, method, metric, k))
        return f"{row['value']:.4f}" if _finite(row) else "-"

    lines: list[str] = []
    for dataset, protocol, candidates in blocks:
        slices = [s for d, p, c, s in sections if (d, p, c) == (dataset, protocol, candidates)]
        methods = _ordered_methods(
            r["method"]
            for r in results
            if (r["dataset"], r["protocol"], r["candidates"]) == (dataset, protocol, candidates)
        )
        # A slice's two columns together are at least as wide as its name.
        widths = [max(6, len(s) // 2) for s in slices]
        title = (
            f"{dataset} ({protocol}) · candidates: {candidates}" if several else f"candidates: {candidates}"
        )
        header = "".ljust(method_width) + "  ".join(
            s.ljust(2 * w + 1) for s, w in zip(slices, widths, strict=True)
        )
        sub = "method".ljust(method_width) + "  ".join(
            f"R@{k}".rjust(w) + " " + f"N@{k}".rjust(w) for w in widths
        )
        lines += ([""] if lines else []) + [title, header, sub, "-" * len(sub)]
        for method in methods:
            cells = [
                value((dataset, protocol, candidates, s), method, "recall").rjust(w)
                + " "
                + value((dataset, protocol, candidates, s), method, "ndcg").rjust(w)
                for s, w in zip(slices, widths, strict=True)
            ]
            lines.append(method.ljust(method_width) + "  ".join(cells))
    return "\n".join(line.rstrip() for line in lines) + "\n"


# --- Files ----------------------------------------------------------------------------------------------------------


def metric_curves(
    results: Sequence[Mapping], metric: str, *, slice_: str = "all"
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, tuple[str, str]]]:
    """Series `method (candidates)` of (K, value) for one metric and slice, and their styles.

    A method keeps its colour across candidate sets and charts; the candidate set picks the dash (solid for the
    first). With a single candidate set the series are named by method alone.
    """
    rows = [r for r in results if r["metric"] == metric and r["slice"] == slice_ and _finite(r)]
    candidate_sets = list(dict.fromkeys(r["candidates"] for r in results))
    methods = _ordered_methods(r["method"] for r in results)
    series: dict[str, list[tuple[float, float]]] = {}
    styles: dict[str, tuple[str, str]] = {}
    for c, candidates in enumerate(candidate_sets):
        for m, method in enumerate(methods):
            points = sorted(
                (float(r["k"]), float(r["value"]))
                for r in rows
                if r["method"] == method and r["candidates"] == candidates
            )
            if not points:
                continue
            name = f"{method} ({candidates})" if len(candidate_sets) > 1 else method
            series[name] = points
            styles[name] = (PALETTE[m % len(PALETTE)], DASHES[c % len(DASHES)])
    return series, styles


def write_report(
    folder: str | Path,
    results: Sequence[Mapping],
    *,
    title: str,
    context: Mapping[str, str | int | float],
    notes: Sequence[str] = (),
    token_usage: Mapping[int, Mapping[str, float]] | None = None,
    ranking: RankingSection | None = None,
    k: int = 50,
) -> str:
    """Write `report.md`, `recall_at_k.svg`, `ndcg_at_k.svg` and (with token_usage) `token_usage.svg` into folder.

    Written atomically by `publish_report`; a `token_usage.svg` (or ranking chart) of an earlier run that this one
    has not is removed. Returns the report's path.

    token_usage: quantiser level -> series (e.g. 'codes used share', 'normalised entropy', 'collision rate') ->
    value in [0, 1].
    """
    charts: dict[str, str] = {}
    for metric, file_name in (("recall", RECALL_CHART), ("ndcg", NDCG_CHART)):
        series, styles = metric_curves(results, metric)
        label = METRIC_LABELS[metric]
        charts[file_name] = svg_line_chart(
            series, title=f"{label}@K, all users", x_label="K", y_label=f"{label}@K", styles=styles
        )
    if token_usage:
        groups = {f"level {level}": dict(values) for level, values in sorted(token_usage.items())}
        charts[TOKEN_CHART] = svg_bar_chart(
            groups, title="Token usage per level", y_label="fraction (0-1)", y_max=1.0
        )

    plots = {
        "Recall@K per method (slice all)": RECALL_CHART,
        "NDCG@K per method (slice all)": NDCG_CHART,
    }
    if TOKEN_CHART in charts:
        plots["Token usage per quantiser level"] = TOKEN_CHART
    markdown = render_markdown(results, title=title, context=context, notes=notes, plots=plots, k=k)
    if ranking is not None:
        ranking_plots = ranking_charts(ranking)
        charts.update(ranking_plots)
        lines = render_ranking(ranking)
        lines += [f"![{name}]({name})" + "\n" for name in ranking_plots]
        markdown += "\n" + "\n".join(lines)

    stale = [name for name in (TOKEN_CHART, LIFT_CHART, IMPORTANCE_CHART) if name not in charts]
    return publish_report(folder, charts, markdown, stale=stale)


def publish_report(
    folder: str | Path, charts: Mapping[str, str], markdown: str, *, stale: Sequence[str] = ()
) -> str:
    """Write the charts and `report.md` into `folder` (a path or a URI) so that a reader never sees half a file
    and a new report never points at an old chart: each file is replaced whole (`storage.write_text`: a temporary
    file and os.replace locally, one PUT on an object store), `report.md` last. `stale` files (charts an earlier
    run had) are removed; other files are left alone. Returns the report's path or URI."""
    for file_name, text in charts.items():
        storage.write_text(storage.join(folder, file_name), text)
    report = storage.join(folder, REPORT_FILE)
    storage.write_text(report, markdown)
    for name in stale:
        storage.remove(storage.join(folder, name))
    return report
