"""Drift between two days' representations: Spark joins for the per-entity comparisons, numpy for the neighbours.

An entity is compared with itself on the previous day: the cosine of its two embeddings, whether its strongest
level-0 and level-1 tokens are the same ids, and (on a hash sample) how many of its 10 nearest same-type
neighbours are the same. Entities are split by whether their neighbourhood sample holds the same neighbour ids on
both days: a ranking model may expect the changed ones to move, never the unchanged ones.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

COHORTS = ("unchanged", "changed", "all")
NEIGHBOURS = 10  # overlap@10: the size of a typical candidate list a ranking model sees per entity


def day_view(embeddings: DataFrame, tokens: DataFrame, neighbourhoods: DataFrame, ds: dt.date) -> DataFrame:
    """One row per entity embedded on `ds`: vector, model version, its neighbour-set signature and its
    strongest level-0 and level-1 tokens."""
    on_day = lambda df: df.where(F.col("ds") == F.lit(ds))  # noqa: E731
    strongest = (
        on_day(tokens)
        .where((F.col("rank") == 1) & (F.col("bom_level") <= 1))
        .groupBy("node_id")
        .agg(
            F.max(F.when(F.col("bom_level") == 0, F.col("token"))).alias("level0"),
            F.max(F.when(F.col("bom_level") == 1, F.col("token"))).alias("level1"),
        )
    )
    neighbours = F.array_sort(F.filter("token_node_id", lambda n: n != 0))
    signatures = on_day(neighbourhoods).select("node_id", F.xxhash64(neighbours).alias("signature"))
    return (
        on_day(embeddings)
        .select("entity_type", "node_id", "vector", "model_version")
        .join(signatures, "node_id", "left")
        .join(strongest, "node_id", "left")
    )


def paired(today: DataFrame, previous: DataFrame) -> DataFrame:
    """Entities of both days with their cosine (dot product of unit vectors; NULL when the dims differ), cohort
    and whether each token level kept its id."""
    prev = previous.select(
        "entity_type",
        "node_id",
        F.col("vector").alias("prev_vector"),
        F.col("model_version").alias("prev_model_version"),
        F.col("signature").alias("prev_signature"),
        F.col("level0").alias("prev_level0"),
        F.col("level1").alias("prev_level1"),
    )
    both = today.join(prev, ["entity_type", "node_id"])
    dot = F.aggregate(
        F.zip_with("vector", "prev_vector", lambda a, b: a * b), F.lit(0.0), lambda acc, x: acc + x
    )

    def kept(a: str, b: str):
        return F.when(F.col(a).isNotNull() & F.col(b).isNotNull(), (F.col(a) == F.col(b)).cast("double"))

    unchanged = F.col("signature").isNotNull() & (F.col("signature") == F.col("prev_signature"))
    return both.select(
        "entity_type",
        "node_id",
        "vector",
        "prev_vector",
        "model_version",
        "prev_model_version",
        F.when(F.size("vector") == F.size("prev_vector"), dot).alias("cosine"),
        F.when(unchanged, F.lit("unchanged")).otherwise(F.lit("changed")).alias("cohort"),
        kept("level0", "prev_level0").alias("level0_kept"),
        kept("level1", "prev_level1").alias("level1_kept"),
    )


def cohort_stats(pairs: DataFrame) -> DataFrame:
    """Per (entity_type, cohort), the cohorts 'unchanged', 'changed' and 'all': count, cosine mean and
    percentiles, token kept shares, model versions."""
    both_cohorts = pairs.unionByName(pairs.withColumn("cohort", F.lit("all")))
    # Exact (interpolated, as numpy's default): an approximate sketch would move with the tables' file layout.
    quantiles = F.percentile("cosine", F.array(F.lit(0.1), F.lit(0.5), F.lit(0.9)))
    return (
        both_cohorts.groupBy("entity_type", "cohort")
        .agg(
            F.count(F.lit(1)).alias("entities"),
            F.avg("cosine").alias("cosine_mean"),
            quantiles.alias("q"),
            F.avg("level0_kept").alias("level0_kept"),
            F.avg("level1_kept").alias("level1_kept"),
            F.max("model_version").alias("model_version"),
            F.max("prev_model_version").alias("previous_model_version"),
        )
        .select(
            "entity_type",
            "cohort",
            "entities",
            "cosine_mean",
            F.col("q")[0].cast("double").alias("cosine_p10"),
            F.col("q")[1].cast("double").alias("cosine_p50"),
            F.col("q")[2].cast("double").alias("cosine_p90"),
            "level0_kept",
            "level1_kept",
            "model_version",
            "previous_model_version",
        )
    )


def nearest(queries: np.ndarray, corpus: np.ndarray, self_index: np.ndarray, k: int) -> np.ndarray:
    """(Q, k) corpus indices of each query's k highest dot products, the query itself left out."""
    scores = queries @ corpus.T  # (Q, N)
    scores[np.arange(len(queries)), self_index] = -np.inf
    k = min(k, corpus.shape[0] - 1)
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k > 0 else np.zeros((len(queries), 0), np.int64)
    return top


def neighbour_overlap(
    pairs: DataFrame, sample: int, corpus_cap: int, k: int = NEIGHBOURS
) -> Mapping[tuple[str, str], tuple[float, int]]:
    """(entity_type, cohort) -> (mean overlap@k, entities measured). Per type, the corpus is the entities of both
    days (capped at `corpus_cap` by hash order, so the same ones on every run), the queries its `sample` first in
    hash order; each query's k nearest neighbours are found in the corpus on each day, each day in its own space."""
    ranked = pairs.select(
        "entity_type", "node_id", "cohort", "vector", "prev_vector", F.xxhash64("node_id").alias("h")
    )
    out: dict[tuple[str, str], tuple[float, int]] = {}
    types = [r["entity_type"] for r in ranked.select("entity_type").distinct().collect()]
    for entity_type in sorted(types):
        frame = (
            ranked.where(F.col("entity_type") == entity_type)
            .orderBy("h", "node_id")
            .limit(corpus_cap)
            .toPandas()
        )
        if len(frame) < 2:
            continue
        today = np.stack(frame["vector"].to_numpy()).astype(np.float32)
        before = np.stack(frame["prev_vector"].to_numpy()).astype(np.float32)
        queries = np.arange(min(sample, len(frame)))
        a = nearest(today[queries], today, queries, k)
        b = nearest(before[queries], before, queries, k)
        overlap = np.array([len(np.intersect1d(x, y)) / a.shape[1] for x, y in zip(a, b, strict=True)])
        cohorts = frame["cohort"].to_numpy()[queries]
        for cohort in COHORTS:
            mask = np.ones(len(queries), bool) if cohort == "all" else cohorts == cohort
            if mask.any():
                out[(entity_type, cohort)] = (float(overlap[mask].mean()), int(mask.sum()))
    return out
