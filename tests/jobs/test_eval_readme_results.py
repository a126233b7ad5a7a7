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


def test_replace_section_keeps_the_rest_and_needs_the_markers():
    readme = f"# T\n\nbefore\n{START}\nold\n{END}\nafter\n"
    out = replace_section(readme, f"{START}\nnew\n{END}")
    assert out == f"# T\n\nbefore\n{START}\nnew\n{END}\nafter\n"
    with pytest.raises(HirError, match="no results markers"):
        replace_section("# T\n", "x")
