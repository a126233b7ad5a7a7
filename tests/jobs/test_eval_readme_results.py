"""The README results section: compact @50 tables from eval_metrics rows, spliced between the markers."""

from __future__ import annotations

import pytest

from jobs.common.errors import HirError
from jobs.eval.readme_results import END, START, replace_section, table


def row(method, candidates, slice_, metric, value, users=40):
    return {"method": method, "candidates": candidates, "slice": slice_, "metric": metric, "value": value,
            "num_users": users, "k": 50}  # fmt: skip


def test_table_has_a_row_per_method_hir_first_and_bolds_the_best_per_column():
    rows = [
        row("popularity", "catalog", "all", "recall", 0.10),
        row("popularity", "catalog", "all", "ndcg", 0.05),
        row("hir", "catalog", "all", "recall", 0.20),
        row("hir", "catalog", "all", "ndcg", 0.04),
        row("als", "graph", "all", "recall", 0.30, users=12),
    ]
    text = table(rows, "warehouse/x/reports/temporal/2024-01-01/report.md")
    lines = text.splitlines()
    assert lines[0] == "| method | graph · all | catalog · all |"
    assert lines[2] == "| `hir` | – | **0.200** / 0.040 |"
    assert lines[3] == "| `als` | **0.300** / – | – |"
    assert lines[4] == "| `popularity` | – | 0.100 / **0.050** |"
    assert lines[5] == "| users | 12 | 40 |"
    assert text.endswith("`warehouse/x/reports/temporal/2024-01-01/report.md`.")


def test_the_paired_difference_against_each_columns_best_baseline_follows_the_table():
    rows = [
        row("hir", "graph", "all", "recall", 0.30),
        row("hir", "graph", "all", "ndcg", 0.20),
        row("als", "graph", "all", "recall", 0.40),
        row("als", "graph", "all", "ndcg", 0.10),
        row("co_visitation", "graph", "all", "recall", 0.35),
        row("co_visitation", "graph", "all", "ndcg", 0.15),
        # HIR minus each baseline, as the evaluation stores them: only the best baseline's are quoted.
        {**row("als", "graph", "all", "hir_recall_diff", -0.10), "ci_low": -0.15, "ci_high": -0.05},
        {**row("co_visitation", "graph", "all", "hir_recall_diff", -0.05), "ci_low": -0.09, "ci_high": 0.0},
        {**row("co_visitation", "graph", "all", "hir_ndcg_diff", 0.05), "ci_low": 0.01, "ci_high": 0.08},
        {**row("als", "graph", "all", "hir_ndcg_diff", 0.10), "ci_low": 0.06, "ci_high": 0.14},
    ]
    text = table(rows, None)
    assert text.splitlines()[-1] == (
        "`hir` minus the best baseline, paired over users [95% CI], bold where the CI is above zero: graph · all: "
        "Recall@50 -0.100 [-0.150, -0.050] against `als`, NDCG@50 **+0.050** [+0.010, +0.080] against "
        "`co_visitation`."
    )
    # The difference rows add no method and no column of their own.
    assert [line.split(" |")[0] for line in text.splitlines()[2:5]] == [
        "| `hir`",
        "| `als`",
        "| `co_visitation`",
    ]
    assert "hir_recall_diff" not in text and "minus the best" not in table(rows[:6], None)


def test_hir_minus_each_ablation_follows_the_baseline_difference():
    rows = [
        row("hir", "graph", "all", "recall", 0.30),
        row("hir", "graph", "all", "ndcg", 0.20),
        row("hir_no_content", "graph", "all", "recall", 0.25),
        row("hir_no_content", "graph", "all", "ndcg", 0.19),
        row("als", "graph", "all", "recall", 0.40),
        row("als", "graph", "all", "ndcg", 0.10),
        {**row("als", "graph", "all", "hir_recall_diff", -0.10), "ci_low": -0.15, "ci_high": -0.05},
        {**row("hir_no_content", "graph", "all", "hir_recall_diff", 0.05), "ci_low": 0.02, "ci_high": 0.08},
        {**row("hir_no_content", "graph", "all", "hir_ndcg_diff", 0.01), "ci_low": -0.01, "ci_high": 0.03},
    ]
    lines = table(rows, None).splitlines()
    assert lines[-3].startswith("`hir` minus the best baseline") and "against `als`" in lines[-3]
    assert "hir_no_content" not in lines[-3]  # an ablation is never the best baseline
    assert lines[-1] == (
        "`hir` minus each ablation, paired over users [95% CI], bold where the CI is above zero (the removed "
        "component earns its place): `hir_no_content`: graph · all Recall@50 **+0.050** [+0.020, +0.080], "
        "NDCG@50 +0.010 [-0.010, +0.030]."
    )
    assert "minus each ablation" not in table(rows[:6], None)


def test_replace_section_keeps_the_rest_and_needs_the_markers():
    readme = f"# T\n\nbefore\n{START}\nold\n{END}\nafter\n"
    out = replace_section(readme, f"{START}\nnew\n{END}")
    assert out == f"# T\n\nbefore\n{START}\nnew\n{END}\nafter\n"
    with pytest.raises(HirError, match="no results markers"):
        replace_section("# T\n", "x")


def test_ranking_table_gives_each_ranker_per_slice_and_the_paired_lift_over_base():
    from jobs.eval.readme_results import ranking_table

    def r(method, slice_, metric, k, value, low=0.0, high=0.0, users=30):
        return {"task": "ranking", "method": method, "slice": slice_, "metric": metric, "k": k, "value": value,
                "ci_low": low, "ci_high": high, "num_users": users}  # fmt: skip

    rows = [
        r("base", "all", "ndcg", 10, 0.200),
        r("base", "all", "ndcg", 50, 0.300),
        r("base+hir", "all", "ndcg", 10, 0.230),
        r("base+hir", "all", "ndcg", 50, 0.310),
        r("base+hir", "all", "ndcg_lift", 10, 0.030, 0.010, 0.050),
        r("base+hir_tokens", "all", "ndcg", 10, 0.190),
        r("base+hir_tokens", "all", "ndcg_lift", 10, -0.010, -0.030, 0.010),
        r("candidate_union", "all", "recall", 50, 0.600),
        {
            **row("hir", "catalog", "all", "recall", 0.2),
            "task": "retrieval",
        },  # another task: not in this table
    ]
    lines = ranking_table(rows).splitlines()
    assert lines[0] == "| ranker | all |"
    assert lines[2] == "| `base` | 0.200 / 0.300 |"
    assert lines[3] == "| `base+hir_embedding` | – |"
    assert lines[4] == "| `base+hir_tokens` | 0.190 (Δ -0.010 [-0.030, +0.010], -5%) |"
    assert lines[5] == "| `base+hir` | 0.230 / 0.310 (Δ **+0.030** [+0.010, +0.050], +15%) |"
    assert lines[6] == "| candidate recall | 0.600 |" and lines[7] == "| users | 30 |"
    # base+hir's CI is 0.040 wide: (1.95996 + 0.84162) x 0.040 / 3.91993 / 0.200 = 14.3%
    assert lines[8] == "| detectable lift | ±14% |"
    assert lines[9] == "| lift ceiling | +400% |"  # base 0.200: at most 1.000
    rows[0] = r("base", "all", "ndcg", 10, 0.992)
    assert ranking_table(rows).splitlines()[9] == "| lift ceiling | +0.8% |"  # one decimal below 10%
    assert ranking_table([rows[-1]]) is None
