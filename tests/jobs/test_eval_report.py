"""The evaluation report: SVG charts that parse, Markdown tables with CIs, bold bests and lift lines, the files."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hir_model import storage
from jobs.eval.report import (
    console_table,
    format_ci,
    nice_ticks,
    render_markdown,
    svg_bar_chart,
    svg_line_chart,
    write_report,
)

SVG = "{http://www.w3.org/2000/svg}"

# method -> (recall@50, ndcg@50, hit_rate@50) on graph/all; CIs are value -/+ 0.01.
VALUES = {
    "hir": (0.150, 0.080, 0.300),
    "hir_no_bias": (0.130, 0.070, 0.280),
    "popularity": (0.100, 0.050, 0.200),
    "covisitation": (0.120, 0.060, 0.250),
}


def result_rows(values=VALUES, candidates="graph", slice_="all", ks=(50,)) -> list[dict]:
    rows = []
    for method, triple in values.items():
        for metric, value in zip(("recall", "ndcg", "hit_rate"), triple, strict=True):
            for k in ks:
                scaled = value * k / 50
                rows.append(
                    {
                        "dataset": "taobao",
                        "protocol": "temporal",
                        "model_version": "v1",
                        "method": method,
                        "candidates": candidates,
                        "slice": slice_,
                        "metric": metric,
                        "k": k,
                        "value": scaled,
                        "ci_low": scaled - 0.01,
                        "ci_high": scaled + 0.01,
                        "num_users": 321,
                    }
                )
    return rows


def markdown(rows, **kwargs) -> str:
    args = {
        "title": "HIR on Taobao",
        "context": {"dataset": "taobao", "users": 321},
        "notes": [],
        "plots": {},
    }
    return render_markdown(rows, **{**args, **kwargs})


def table_row(text: str, method: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| `{method}` |"))


def test_line_chart_parses_with_one_polyline_per_series_and_a_legend():
    series = {
        "hir (graph)": [(10, 0.1), (20, 0.15), (50, 0.2), (100, 0.3)],
        "pop <&> (graph)": [(10, 0.05), (20, 0.07), (50, 0.1), (100, 0.12)],
        "als": [(50, 0.08)],
    }
    svg = svg_line_chart(series, title="Recall@K", x_label="K", y_label="Recall@K")
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    polylines = root.findall(f".//{SVG}polyline")
    assert len(polylines) == 3
    assert len(polylines[0].get("points").split()) == 4
    legend = root.find(f".//{SVG}g[@class='legend']")
    assert [t.text for t in legend.findall(f"{SVG}text")] == list(series)  # the '<&>' name survived escaping
    assert len({p.get("stroke") for p in polylines}) == 3


def test_line_chart_places_categorical_k_evenly():
    svg = svg_line_chart(
        {"a": [(10, 0.1), (20, 0.2), (50, 0.3), (100, 0.4)]}, title="t", x_label="K", y_label="y"
    )
    points = ET.fromstring(svg).find(f".//{SVG}polyline").get("points").split()
    xs = [float(p.split(",")[0]) for p in points]
    gaps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    assert max(gaps) - min(gaps) < 0.05
    linear = svg_line_chart(
        {"a": [(10, 0.1), (20, 0.2), (50, 0.3), (100, 0.4)]},
        title="t",
        x_label="K",
        y_label="y",
        categorical_x=False,
    )
    xs = [
        float(p.split(",")[0]) for p in ET.fromstring(linear).find(f".//{SVG}polyline").get("points").split()
    ]
    assert (xs[3] - xs[2]) > 3 * (xs[1] - xs[0])


def test_line_chart_higher_values_are_drawn_higher():
    svg = svg_line_chart({"a": [(1, 0.0), (2, 1.0)]}, title="t", x_label="x", y_label="y")
    (_, y0), (_, y1) = (
        map(float, p.split(",")) for p in ET.fromstring(svg).find(f".//{SVG}polyline").get("points").split()
    )
    assert y1 < y0  # SVG y grows downwards


def test_line_chart_palette_repeats_dashed_beyond_ten_series():
    series = {f"m{i}": [(10, i / 20)] for i in range(12)}
    polylines = ET.fromstring(svg_line_chart(series, title="t", x_label="K", y_label="y")).findall(
        f".//{SVG}polyline"
    )
    styles = {(p.get("stroke"), p.get("stroke-dasharray")) for p in polylines}
    assert len(styles) == 12


def test_bar_chart_has_one_bar_per_value_and_legend_names():
    groups = {
        "level 1": {"codes used share": 0.8, "normalised entropy": 0.9, "collision rate": 0.1},
        "level 2": {"codes used share": 0.5, "normalised entropy": 0.7},
    }
    root = ET.fromstring(svg_bar_chart(groups, title="Token usage", y_label="fraction"))
    bars = root.findall(f".//{SVG}g[@class='group']/{SVG}rect")
    assert len(bars) == 5
    heights = [float(b.get("height")) for b in bars]
    assert heights[1] > heights[0] > heights[3] > heights[2]
    legend = root.find(f".//{SVG}g[@class='legend']")
    assert [t.text for t in legend.findall(f"{SVG}text")] == [
        "codes used share",
        "normalised entropy",
        "collision rate",
    ]


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 0.37) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert nice_ticks(0, 1) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(0, 0) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])


def test_format_ci():
    assert format_ci(0.1234, 0.1011, 0.1449) == "0.123 [0.101, 0.145]"
    assert format_ci(0.5, 0.4, 0.6, bold=True) == "**0.500** [0.400, 0.600]"
    assert format_ci(float("nan"), 0, 0) == "n/a"


def test_markdown_has_context_cis_and_bold_best_per_column():
    text = markdown(result_rows())
    assert text.startswith("# HIR on Taobao\n")
    assert "| users | 321 |" in text
    assert "## Candidates: graph · slice: all" in text
    assert "| Method | Recall@50 [95% CI] | NDCG@50 [95% CI] | HitRate@50 [95% CI] | Users |" in text
    assert table_row(text, "hir") == (
        "| `hir` | **0.150** [0.140, 0.160] | **0.080** [0.070, 0.090] | **0.300** [0.290, 0.310] | 321 |"
    )
    assert table_row(text, "popularity") == (
        "| `popularity` | 0.100 [0.090, 0.110] | 0.050 [0.040, 0.060] | 0.200 [0.190, 0.210] | 321 |"
    )
    assert text.count("**") == 2 * 3


def test_bold_follows_the_best_method_in_each_column():
    values = {"hir": (0.150, 0.040, 0.300), "popularity": (0.100, 0.050, 0.200)}
    text = markdown(result_rows(values))
    assert "| `hir` | **0.150**" in text
    assert "| `popularity` | 0.100 [0.090, 0.110] | **0.050** [0.040, 0.060] |" in text


def test_lift_line_against_the_best_baseline():
    text = markdown(result_rows())
    # Best baseline is covisitation (0.120 recall, 0.060 ndcg); the ablation hir_no_bias is not a baseline.
    assert (
        "Lift of `hir` over the best baseline (paired 95% CI over the same users where measured) — Recall@50 "
        "0.150 vs `covisitation` 0.120: +0.030 (+25.0%); NDCG@50 0.080 vs `covisitation` 0.060: +0.020 (+33.3%)."
        in text
    )


def test_lift_line_gives_the_paired_ci_of_hir_against_the_best_baseline_only():
    rows = result_rows()
    base = {k: v for k, v in rows[0].items() if k not in ("method", "metric", "value", "ci_low", "ci_high")}
    # Paired differences stored on each baseline's method; only the best baseline's (covisitation) is quoted.
    for method, metric, value, low, high in (
        ("covisitation", "hir_ndcg_diff", 0.02, -0.004, 0.045),
        ("popularity", "hir_ndcg_diff", 0.03, 0.011, 0.052),
        ("covisitation", "hir_recall_diff", 0.03, 0.001, 0.061),
    ):
        rows.append(
            {**base, "method": method, "metric": metric, "value": value, "ci_low": low, "ci_high": high}
        )
    text = markdown(rows)
    assert "Recall@50 0.150 vs `covisitation` 0.120: +0.030 [+0.001, +0.061] (+25.0%)" in text
    assert "NDCG@50 0.080 vs `covisitation` 0.060: +0.020 [-0.004, +0.045] (+33.3%)" in text
    # The difference rows are not methods of their own: the table keeps one row per method, unchanged.
    assert table_row(text, "covisitation").startswith("| `covisitation` | 0.120 [0.110, 0.130] |")
    assert text.count("| `covisitation` |") == 1


def test_the_ablation_line_gives_hir_minus_each_ablation_and_bolds_a_component_that_earns_its_place():
    rows = result_rows()
    base = {k: v for k, v in rows[0].items() if k not in ("method", "metric", "value", "ci_low", "ci_high")}
    assert "minus each ablation" not in markdown(rows)  # no paired rows, no line
    for method, metric, value, low, high in (
        ("hir_no_bias", "hir_recall_diff", 0.02, 0.004, 0.036),  # the bias earns its place on recall
        ("hir_no_bias", "hir_ndcg_diff", 0.01, -0.006, 0.026),
        ("popularity", "hir_recall_diff", 0.05, 0.03, 0.07),  # a baseline's: not an ablation
    ):
        rows.append(
            {**base, "method": method, "metric": metric, "value": value, "ci_low": low, "ci_high": high}
        )
    text = markdown(rows)
    assert (
        "`hir` minus each ablation (paired 95% CI over the same users; bold where the CI is above zero, so the "
        "removed component earns its place) — `hir_no_bias` Recall@50 **+0.020** [+0.004, +0.036], NDCG@50 "
        "+0.010 [-0.006, +0.026]." in text
    )
    assert "`popularity` Recall" not in text
    # The baselines' lift line still quotes the best baseline, never an ablation.
    assert "Recall@50 0.150 vs `covisitation` 0.120" in text


def test_lift_line_reports_losses_and_missing_hir():
    values = {"hir": (0.090, 0.050, 0.2), "popularity": (0.100, 0.040, 0.2)}
    text = markdown(result_rows(values))
    assert "Recall@50 0.090 vs `popularity` 0.100: -0.010 (-10.0%)" in text
    assert "NDCG@50 0.050 vs `popularity` 0.040: +0.010 (+25.0%)" in text
    no_hir = markdown(result_rows({"popularity": (0.1, 0.05, 0.2)}))
    assert "Recall@50: no `hir` result" in no_hir


def test_one_table_per_candidates_and_slice_with_plots_and_notes():
    rows = result_rows() + result_rows(candidates="catalog") + result_rows(slice_="no_prior_conversion")
    text = markdown(
        rows, plots={"Recall@K": "recall_at_k.svg"}, notes=["Catalog targets are over-represented."]
    )
    headings = [line for line in text.splitlines() if line.startswith("## Candidates")]
    assert headings == [
        "## Candidates: graph · slice: all",
        "## Candidates: catalog · slice: all",
        "## Candidates: graph · slice: no_prior_conversion",
    ]
    assert text.count("Lift of `hir`") == 3
    assert "![Recall@K](recall_at_k.svg)" in text
    assert "- Catalog targets are over-represented." in text


def test_console_table_lists_every_method_with_its_values():
    rows = result_rows() + result_rows(candidates="catalog", values={"hir": (0.2, 0.1, 0.3)})
    text = console_table(rows)
    for method in VALUES:
        assert method in text
    hir_lines = [line for line in text.splitlines() if line.startswith("hir ")]
    assert hir_lines[0].split()[1:] == ["0.1500", "0.0800"]
    assert hir_lines[1].split()[1:] == ["0.2000", "0.1000"]
    assert "candidates: catalog" in text
    widths = {
        len(line) for line in text.splitlines() if line.startswith(("hir", "popularity", "covisitation"))
    }
    assert len(widths) == 1  # fixed width: values line up


def test_write_report_creates_the_files(tmp_path: Path):
    rows = result_rows(ks=(10, 20, 50, 100)) + result_rows(candidates="catalog", ks=(10, 20, 50, 100))
    folder = tmp_path / "warehouse" / "report"
    usage = {1: {"codes used share": 0.8, "normalised entropy": 0.9, "collision rate": 0.05}}
    path = write_report(
        folder, rows, title="HIR", context={"dataset": "taobao"}, notes=["n"], token_usage=usage
    )
    assert path == str(folder / "report.md")
    assert sorted(p.name for p in folder.iterdir()) == [
        "ndcg_at_k.svg",
        "recall_at_k.svg",
        "report.md",
        "token_usage.svg",
    ]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["report"]  # no staging folder left behind
    text = Path(path).read_text()
    for name in ("recall_at_k.svg", "ndcg_at_k.svg", "token_usage.svg"):
        assert f"]({name})" in text
    recall = ET.parse(folder / "recall_at_k.svg").getroot()
    legend = [t.text for t in recall.find(f".//{SVG}g[@class='legend']").findall(f"{SVG}text")]
    assert "hir (graph)" in legend and "popularity (catalog)" in legend
    assert len(recall.findall(f".//{SVG}polyline")) == 2 * len(VALUES)
    ET.parse(folder / "token_usage.svg")


def test_write_report_replaces_an_earlier_report_and_keeps_other_files(tmp_path: Path):
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    usage = {1: {"codes used share": 0.5}}
    write_report(folder, result_rows(), title="first", context={}, notes=[], token_usage=usage)
    write_report(folder, result_rows(), title="second", context={}, notes=[], token_usage=None)
    assert (folder / "report.md").read_text().startswith("# second\n")
    assert not (folder / "token_usage.svg").exists()  # a stale chart would be mistaken for this run's
    assert (folder / "keep.txt").read_text() == "mine"


def test_a_report_on_an_object_store_is_the_same_files(tmp_path: Path, s3_server, s3_settings):
    local = tmp_path / "report"
    remote = s3_server.new_bucket("reports") + "/eval/report"
    usage = {1: {"codes used share": 0.5}}
    for folder in (local, remote):
        write_report(folder, result_rows(), title="first", context={}, notes=[], token_usage=usage)
        path = write_report(folder, result_rows(), title="second", context={}, notes=[], token_usage=None)
    assert path == remote + "/report.md"
    assert storage.listdir(remote) == sorted(
        p.name for p in local.iterdir()
    )  # the stale chart went there too
    for name in storage.listdir(remote):
        assert storage.read_text(storage.join(remote, name)) == (local / name).read_text()


def test_ranking_section_tables_the_rankers_and_draws_the_relative_lift():
    import xml.etree.ElementTree as ET

    from jobs.eval.report import (
        RankingSection,
        detectable_lift,
        lift_ceiling,
        ranking_charts,
        ranking_console,
        relative_lift,
        render_ranking,
    )

    def r(method, metric, k, value, low=None, high=None):
        return {"method": method, "slice": "all", "metric": metric, "k": k, "value": value,
                "ci_low": value if low is None else low, "ci_high": value if high is None else high,
                "num_users": 50}  # fmt: skip

    rows = [
        r("base", "ndcg", 10, 0.20), r("base", "ndcg", 50, 0.30), r("base", "recall", 50, 0.5), r("base", "auc", 0, 0.7),
        r("base+hir", "ndcg", 10, 0.25), r("base+hir", "ndcg_lift", 10, 0.05, 0.01, 0.09),
        r("candidate_union", "recall", 50, 0.8),
    ]  # fmt: skip
    section = RankingSection(rows, {"base": {"generators": 0.7, "item": 0.3}, "base+hir": {"generators": 0.4,
                             "hir_embedding": 0.6}}, {"folds (users each)": "5 (10, 10, 10, 10, 10)"})  # fmt: skip
    assert relative_lift(rows, "base+hir", "all") == pytest.approx(0.25)
    text = "\n".join(render_ranking(section))
    # detectable: CI width 0.08 = 2 x 1.95996 standard errors; (1.95996 + 0.84162) x 0.020410 / 0.20 = 28.6%
    assert detectable_lift(rows, "base+hir", "all") == pytest.approx(0.28588, abs=1e-4)
    # at 50% power, the interval's half-width: 0.04 / 0.20
    assert detectable_lift(rows, "base+hir", "all", power=0.5) == pytest.approx(0.2, abs=1e-4)
    assert detectable_lift(rows, "base+hir_tokens", "all") is None  # no lift row
    assert lift_ceiling(rows, "all") == pytest.approx(4.0)  # base 0.20 can at most reach 1.00
    assert lift_ceiling([r("base", "ndcg", 10, 0.992)], "all") == pytest.approx(0.00806, abs=1e-5)
    assert (
        "| `base+hir` | 0.250 [0.250, 0.250] | n/a | n/a | n/a | 0.050 [0.010, 0.090] | +25.0% | ±28.6% |"
        in text
    )
    assert "base+hir_tokens" not in text  # a ranker that did not run has no row
    assert "Candidate recall (the ceiling of every ranker): 0.800" in text
    assert "| `base+hir` | 40.0% |  | 60.0% |" in text  # importance: generators, item, hir_embedding
    charts = ranking_charts(section)
    lift = ET.fromstring(charts["ranking_lift.svg"])
    bars = [e for e in lift.iter() if e.tag.endswith("rect") and e.find("{*}title") is not None]
    assert [b.find("{*}title").text for b in bars] == ["all, base+hir: 25.0000"]
    assert "lift +0.0500 [+0.0100, +0.0900] (+25.0%; detectable ±29%)" in ranking_console(rows)
