"""The baselines HIR is judged against, each a function from the history to a top-K item list per user.

Every ranking is a DataFrame (user, item, rank, score) of node ids (rank 1 = best; the score it ranked by), at
most K rows per user, over a given candidate set, so that every method scores exactly the same users and candidates:

* popularity: items by conversions (cart + purchase events) in the history, the same list for everyone;
* co_visitation: item-to-item cosine over users' stage-weighted histories, scored from the user's items;
* als: Spark MLlib ALS with implicit feedback, tuned on a validation split cut from the history;
* category_popularity: popular items in the categories and brands the user engaged with (scores new items);
* content_only (numpy, in jobs.evaluate): the user's stage-weighted mean of item content embeddings.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from jobs.build_graph import node_id
from jobs.eval.split import DEEP_STAGES, funnel_events, stage_weight
from schemas.codes import DEFAULT_STAGE_WEIGHTS

# A user's 50 heaviest items carry their interests; a hub user's 500-item tail would square the pair count.
CO_VISIT_HISTORY = 50
# Co-items kept per item: scores beyond the 200th neighbour barely move a top-100 list.
CO_VISIT_NEIGHBOURS = 200
# Candidates kept per category/brand in category-aware popularity (a huge category is not a huge join).
CATEGORY_CANDIDATES = 1000
# ALS grid, small on purpose (issue: tuned on a validation split, never on the targets). Ranks bracket the
# usual 16-64; reg and alpha span the decades Hu, Koren & Volinsky (2008) and Spark's defaults sit in.
ALS_GRID = {"rank": (16, 64), "regParam": (0.01, 0.1), "alpha": (1.0, 10.0)}
ALS_MAX_ITER = 10


def user_node(column: str = "user_id") -> Column:
    return node_id(F.col("source"), F.lit("user"), F.col(column))


def item_node(column: str = "item_id") -> Column:
    return node_id(F.col("source"), F.lit("item"), F.col(column))


def interactions(history: DataFrame, weights: dict[str, float] | None = None) -> DataFrame:
    """(user, item, weight, deep, events): a user's stage-weighted engagement with an item, by node id."""
    weights = weights or DEFAULT_STAGE_WEIGHTS
    return (
        funnel_events(history)
        .select(
            user_node().alias("user"),
            item_node().alias("item"),
            stage_weight(weights).alias("w"),
            F.col("funnel_stage").isin(list(DEEP_STAGES)).cast("long").alias("is_deep"),
        )
        .groupBy("user", "item")
        .agg(F.sum("w").alias("weight"), F.sum("is_deep").alias("deep"), F.count(F.lit(1)).alias("events"))
    )


def top_k(scored: DataFrame, k: int) -> DataFrame:
    """(user, item, rank, score): the k best-scored items per user; ties go to the smaller node id."""
    order = Window.partitionBy("user").orderBy(F.desc("score"), F.asc("item"))
    return (
        scored.withColumn("rank", F.row_number().over(order))
        .where(F.col("rank") <= k)
        .select("user", "item", F.col("rank").cast("int"), F.col("score").cast("double"))
    )


def popularity(ui: DataFrame, users: DataFrame, candidates: DataFrame, k: int) -> DataFrame:
    """The k candidates with the most conversions in the history (then most engagement), for every user."""
    pop = ui.groupBy("item").agg(F.sum("deep").alias("deep"), F.sum("weight").alias("weight"))
    order = Window.orderBy(F.desc("deep"), F.desc("weight"), F.asc("item"))  # one global list: k rows
    ranked = (
        candidates.join(pop, "item").withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= k)
    )
    # Conversions, then engagement as a fraction below 1: the same order as the window's.
    score = (F.col("deep") + F.col("weight") / (1.0 + F.col("weight"))).cast("double")
    return users.crossJoin(
        F.broadcast(ranked.select("item", F.col("rank").cast("int"), score.alias("score")))
    )


def co_visitation(ui: DataFrame, users: DataFrame, candidates: DataFrame, k: int) -> DataFrame:
    """Item-to-item cosine over stage-weighted co-occurrence in users' histories; a user's score for item j is
    sum over the user's items i of w(u, i) * cos(i, j), with cos(i, i) = 1 (repeats are legitimate targets)."""
    heaviest = Window.partitionBy("user").orderBy(F.desc("weight"), F.asc("item"))
    uw = ui.withColumn("_r", F.row_number().over(heaviest)).where(F.col("_r") <= CO_VISIT_HISTORY)
    uw = uw.select("user", "item", "weight")
    norms = uw.groupBy("item").agg(F.sqrt(F.sum(F.col("weight") ** 2)).alias("norm"))
    a = uw.select("user", F.col("item").alias("i"), F.col("weight").alias("wi"))
    b = uw.select("user", F.col("item").alias("j"), F.col("weight").alias("wj"))
    co = (
        a.join(b, "user")
        .where(F.col("i") != F.col("j"))
        .groupBy("i", "j")
        .agg(F.sum(F.col("wi") * F.col("wj")).alias("dot"))
        .join(norms.select(F.col("item").alias("i"), F.col("norm").alias("ni")), "i")
        .join(norms.select(F.col("item").alias("j"), F.col("norm").alias("nj")), "j")
        .select("i", "j", (F.col("dot") / (F.col("ni") * F.col("nj"))).alias("cos"))
    )
    nearest = Window.partitionBy("i").orderBy(F.desc("cos"), F.asc("j"))
    co = (
        co.withColumn("_r", F.row_number().over(nearest)).where(F.col("_r") <= CO_VISIT_NEIGHBOURS).drop("_r")
    )
    selves = uw.select(F.col("item").alias("i"), F.col("item").alias("j"), F.lit(1.0).alias("cos")).distinct()
    history = uw.join(users, "user").select("user", F.col("item").alias("i"), F.col("weight"))
    scored = (
        history.join(co.unionByName(selves), "i")
        .groupBy("user", F.col("j").alias("item"))
        .agg(F.sum(F.col("weight") * F.col("cos")).alias("score"))
        .join(candidates, "item", "left_semi")
    )
    return top_k(scored, k)


def category_popularity(
    ui: DataFrame, users: DataFrame, candidates: DataFrame, attributes: DataFrame, k: int
) -> DataFrame:
    """Popular items in the categories and brands the user engaged with.

    score(u, j) = (A(u, category of j) + A(u, brand of j)) * (1 + log(1 + popularity of j)), where A(u, a) is
    the user's stage-weighted engagement with items of a. A new item (no history) scores by its category and
    brand alone, so this baseline ranks the same catalog as HIR. `attributes`: (item, category, brand).
    """
    attrs = attributes.select(
        "item",
        F.explode(
            F.filter(
                F.array(
                    F.concat(F.lit("c:"), F.col("category")),
                    F.concat(F.lit("b:"), F.col("brand")),
                ),
                lambda a: a.isNotNull(),
            )
        ).alias("attr"),
    )
    affinity = (
        ui.join(users, "user")
        .join(attrs, "item")
        .groupBy("user", "attr")
        .agg(F.sum("weight").alias("affinity"))
    )
    pop = ui.groupBy("item").agg(F.sum("weight").alias("pop"))
    factor = (
        candidates.join(pop, "item", "left")
        .select("item", (1.0 + F.log1p(F.coalesce("pop", F.lit(0.0)))).alias("factor"))
        .join(attrs, "item")
    )
    best_in_attr = Window.partitionBy("attr").orderBy(F.desc("factor"), F.asc("item"))
    factor = factor.withColumn("_r", F.row_number().over(best_in_attr)).where(
        F.col("_r") <= CATEGORY_CANDIDATES
    )
    scored = (
        affinity.join(factor, "attr")
        .groupBy("user", "item")
        .agg((F.sum("affinity") * F.first("factor")).alias("score"))
    )
    return top_k(scored, k)


@dataclass(frozen=True)
class AlsChoice:
    params: dict[str, float]
    validation_ndcg: float
    grid: list[tuple[dict[str, float], float]]


def als_fit(ui: DataFrame, params: dict[str, float], seed: int = 0):
    """An implicit-feedback ALS model on (user, item, weight); returns (model, user index, item index)."""
    from pyspark.ml.recommendation import ALS

    users = ui.select("user").distinct().withColumn("u", F.dense_rank().over(Window.orderBy("user")) - 1)
    items = ui.select("item").distinct().withColumn("i", F.dense_rank().over(Window.orderBy("item")) - 1)
    ratings = ui.join(users, "user").join(items, "item").select("u", "i", F.col("weight").cast("float"))
    als = ALS(
        userCol="u",
        itemCol="i",
        ratingCol="weight",
        implicitPrefs=True,
        rank=int(params["rank"]),
        regParam=float(params["regParam"]),
        alpha=float(params["alpha"]),
        maxIter=ALS_MAX_ITER,
        seed=seed,
        coldStartStrategy="drop",
        nonnegative=False,
    )
    return als.fit(ratings), users, items


def als_rank(model_and_index, users: DataFrame, candidates: DataFrame, k: int) -> DataFrame:
    """ALS's top k over the candidates it knows (items in its training data), for the given users."""
    model, user_index, item_index = model_and_index
    subset = user_index.join(users, "user").select("u")
    allowed = item_index.join(candidates, "item", "left_semi").count()
    known = item_index.count()
    # recommendForUserSubset ranks every trained item; over-fetch when part of them is not a candidate.
    fetch = k if allowed == known else min(known, k * 4)
    recs = model.recommendForUserSubset(subset, fetch).select("u", F.explode("recommendations").alias("r"))
    scored = (
        recs.select("u", F.col("r.i").alias("i"), F.col("r.rating").alias("score"))
        .join(user_index, "u")
        .join(item_index, "i")
        .join(candidates, "item", "left_semi")
        .select("user", "item", "score")
    )
    return top_k(scored, k)


def tune_als(
    train_ui: DataFrame,
    validation_users: DataFrame,
    candidates: DataFrame,
    score: Callable[[DataFrame], float],
    k: int,
    grid: dict[str, Sequence[float]] | None = None,
) -> AlsChoice:
    """The grid point with the best validation score (`score` maps a ranking to e.g. NDCG@50); ties: first."""
    grid = grid or ALS_GRID
    results: list[tuple[dict[str, float], float]] = []
    for values in itertools.product(*grid.values()):
        params = dict(zip(grid.keys(), values, strict=True))
        fitted = als_fit(train_ui, params)
        results.append((params, float(score(als_rank(fitted, validation_users, candidates, k)))))
    best = max(results, key=lambda r: (np.nan_to_num(r[1], nan=-1.0), -results.index(r)))
    return AlsChoice(params=best[0], validation_ndcg=best[1], grid=results)


def weighted_profiles(
    ui_users: np.ndarray, ui_items: np.ndarray, ui_weights: np.ndarray, users: np.ndarray, item_vectors: dict
) -> np.ndarray:
    """(len(users), d): each user's weight-averaged, L2-normalised vector of the items it engaged with (items
    without a vector are skipped; a user with none gets zeros and so no recommendation signal)."""
    dim = len(next(iter(item_vectors.values()))) if item_vectors else 0
    position = {u: n for n, u in enumerate(users.tolist())}
    profiles = np.zeros((len(users), dim), dtype=np.float32)
    for user, item, weight in zip(ui_users.tolist(), ui_items.tolist(), ui_weights.tolist(), strict=True):
        row = position.get(user)
        vector = item_vectors.get(item)
        if row is not None and vector is not None:
            profiles[row] += weight * vector
    norms = np.linalg.norm(profiles, axis=1, keepdims=True)
    return np.divide(profiles, norms, out=np.zeros_like(profiles), where=norms > 0)
