"""Skew-safe top-k per group: salted two-stage ranking, exact by construction.

A plain `row_number() OVER (PARTITION BY src ORDER BY key)` sends all of a group's rows to one task: a hub item
with millions of users becomes one straggler task (or an out-of-memory executor). The salted version ranks in
two stages:

1. rank inside (group, salt), where salt = hash(tie-break column) mod `salts`, and keep the top k of each: a hub's
   rows are spread over `salts` tasks;
2. rank the at most salts x k survivors of each group and keep the top k.

Exact: an element of the group's global top k is in the top k of its own salt (fewer than k elements of the
group, let alone of its salt, beat it), so it survives stage 1; stage 2 then sees every candidate. The order must
be total (the tie-break column is unique within a group), otherwise "the" top k is not defined.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

# Salts per group. 32 spreads a hub over 32 tasks; for an ordinary node (tens of edges) it only splits a tiny
# sort into tinier ones, and stage 2 sorts at most 32 x k rows per group.
DEFAULT_SALTS = 32


def _order(order_by: Sequence[Column], tie_break: str) -> list[Column]:
    return [*order_by, F.col(tie_break).asc()]


def top_k(
    df: DataFrame,
    group_by: Sequence[str],
    order_by: Sequence[Column],
    tie_break: str,
    k: int,
    rank_col: str = "rank",
    salts: int = DEFAULT_SALTS,
) -> DataFrame:
    """The first `k` rows of every `group_by` group by `order_by` then `tie_break` ascending, ranked 1..k.

    `tie_break` must be unique within a group (e.g. the destination node of an edge) so the order is total.
    `salts` <= 1 gives the plain one-stage window (the reference the salted version is tested against).
    """
    if k < 1:
        raise ValueError(f"top_k needs k >= 1, got {k}")
    order = _order(order_by, tie_break)
    if salts > 1:
        salt = F.pmod(F.xxhash64(F.col(tie_break), F.lit("topk-salt")), F.lit(salts))
        df = df.withColumn("_salt", salt)
        by_salt = Window.partitionBy(*group_by, "_salt").orderBy(*order)
        df = df.withColumn("_salt_rank", F.row_number().over(by_salt)).where(F.col("_salt_rank") <= k)
        df = df.drop("_salt", "_salt_rank")
    by_group = Window.partitionBy(*group_by).orderBy(*order)
    return df.withColumn(rank_col, F.row_number().over(by_group)).where(F.col(rank_col) <= k)
