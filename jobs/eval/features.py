"""Features of (user, candidate item) pairs for the ranking task: what a ranking team has without HIR, and HIR's.

Every feature comes from the history (events before the user's cut-off), the catalog as of its end, and the
history pipeline's own outputs; none from the targets, and item identity is never a feature, so a ranker cannot
memorise which items converted after the cut-off. Missing values stay NaN (LightGBM learns where they go).

Groups (FEATURE_GROUPS; `base` rankers use BASE_GROUPS):

* generators: each candidate generator's score and rank for the pair (NaN where the item is not in its top list);
* item: users who engaged with the item, users who carted or bought it, their ratio (conversion rate), events,
  whether the item is new (no history engagement);
* user: the user's distinct items, events and deep events;
* user_item: the user's events with the item per funnel stage, hours from the last one to the user's last event;
* affinity: the user's share of stage-weighted engagement in the item's category and with its brand;
* price: the item's price decile in the catalog, its distance to the user's engagement-weighted mean decile;
* hir_embedding: cosine of the user's and the item's HIR embeddings, HIR's rank of the item, cosines of the user
  to the item's category and brand (centroids of their items' embeddings: the graph embeds users and items);
* hir_tokens: per Bag-of-Meaning level, the overlap of the user's and the item's bags (sum of the smaller
  weights, and shared token count), whether the item's strongest token is in the user's bag, and the user's
  weight on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.eval.baselines import item_node, user_node
from jobs.eval.split import funnel_events
from schemas.codes import FUNNEL_STAGES

# The generators whose top lists make the candidates; `hir` is HIR's, the rest are what a team has without it.
BASE_GENERATORS = ("co_visitation", "als", "popularity", "category_popularity")
GENERATORS = (*BASE_GENERATORS, "hir")
BASE_GROUPS = ("generators", "item", "user", "user_item", "affinity", "price")
HIR_GROUPS = ("hir_embedding", "hir_tokens")
PRICE_BANDS = 10


def generator_columns(generators: Sequence[str]) -> list[str]:
    return [f"{g}_{what}" for g in generators if g != "hir" for what in ("score", "rank")]


def candidate_frame(
    rankings: Mapping[str, tuple[Mapping[int, np.ndarray], Mapping[int, np.ndarray]]],
    users: np.ndarray,
    per_generator: int,
) -> pd.DataFrame:
    """(user, item, <generator>_score, <generator>_rank, ...): per user, the union of every generator's top
    `per_generator` items, with every generator's score and rank wherever its (longer) list holds the item.

    rankings: generator -> (user -> items best first, user -> their scores)."""
    wanted = set(users.tolist())
    pieces, chosen = [], []
    for name, (items, scores) in rankings.items():
        rows = [
            (user, item, score, rank)
            for user, ranked in items.items()
            if user in wanted
            for rank, (item, score) in enumerate(zip(ranked.tolist(), scores[user].tolist(), strict=True), 1)
        ]
        frame = pd.DataFrame(rows, columns=["user", "item", f"{name}_score", f"{name}_rank"])
        pieces.append(frame.astype({"user": "int64", "item": "int64", f"{name}_rank": "float64"}))
        chosen.append(pieces[-1].loc[pieces[-1][f"{name}_rank"] <= per_generator, ["user", "item"]])
    out = pd.concat(chosen, ignore_index=True).drop_duplicates()
    for piece in pieces:
        out = out.merge(piece, on=["user", "item"], how="left")
    return out.sort_values(["user", "item"], kind="stable").reset_index(drop=True)


def item_attributes(catalog: DataFrame) -> DataFrame:
    """(item, category, brand, price_band): the catalog's items; price decile (1-10) over the items with a
    price, NaN without one."""
    items = catalog.where(F.col("entity_type") == "item").select(
        item_node("entity_id").alias("item"),
        F.coalesce("category_id", "category_code").alias("category"),
        "brand",
        "price",
    )
    # Decile edges from an approximate quantile (one aggregate, no global sort); band = edges at or below it.
    cuts = [i / PRICE_BANDS for i in range(1, PRICE_BANDS)]
    edges = items.agg(F.percentile_approx("price", cuts).alias("edges"))
    band = F.when(
        F.col("price").isNotNull(),
        (F.size(F.filter("edges", lambda edge: edge <= F.col("price"))) + 1).cast("double"),
    )
    return items.crossJoin(F.broadcast(edges)).select("item", "category", "brand", band.alias("price_band"))


def base_features(cands: DataFrame, history: DataFrame, ui: DataFrame, attributes: DataFrame) -> DataFrame:
    """The `base` groups except generators, for every (user, item) of `cands`.

    history: events before each user's cut-off; ui: bl.interactions of it; attributes: item_attributes."""
    events = funnel_events(history).select(
        user_node().alias("user"), item_node().alias("item"), "funnel_stage", "event_time"
    )
    user_last = events.groupBy("user").agg(F.max("event_time").alias("user_last"))
    pair = (
        events.groupBy("user", "item")
        .agg(
            *[
                F.sum((F.col("funnel_stage") == s).cast("double")).alias(f"ui_{s}_events")
                for s in FUNNEL_STAGES
            ],
            F.max("event_time").alias("pair_last"),
        )
        .join(user_last, "user")
        .withColumn(
            "ui_hours_since_last",
            (F.unix_timestamp("user_last") - F.unix_timestamp("pair_last")).cast("double") / 3600.0,
        )
        .drop("user_last", "pair_last")
    )
    item = ui.groupBy("item").agg(
        F.count(F.lit(1)).cast("double").alias("item_users"),
        F.sum((F.col("deep") > 0).cast("double")).alias("item_deep_users"),
        F.sum("events").cast("double").alias("item_events"),
    )
    item = item.withColumn("item_conversion_rate", F.col("item_deep_users") / F.col("item_users"))
    user = ui.groupBy("user").agg(
        F.count(F.lit(1)).cast("double").alias("user_items"),
        F.sum("events").cast("double").alias("user_events"),
        F.sum("deep").cast("double").alias("user_deep_events"),
        F.sum("weight").alias("_user_weight"),
    )
    engaged = ui.join(attributes, "item")
    category = engaged.groupBy("user", "category").agg(F.sum("weight").alias("_category_weight"))
    brand = engaged.groupBy("user", "brand").agg(F.sum("weight").alias("_brand_weight"))
    band = (
        engaged.where(F.col("price_band").isNotNull())
        .groupBy("user")
        .agg((F.sum(F.col("weight") * F.col("price_band")) / F.sum("weight")).alias("_user_band"))
    )
    out = (
        cands.join(attributes, "item", "left")
        .join(pair, ["user", "item"], "left")
        .join(item, "item", "left")
        .join(user, "user", "left")
        .join(category, ["user", "category"], "left")
        .join(brand, ["user", "brand"], "left")
        .join(band, "user", "left")
    )
    stage_counts = [F.coalesce(f"ui_{s}_events", F.lit(0.0)).alias(f"ui_{s}_events") for s in FUNNEL_STAGES]
    return out.select(
        "user",
        "item",
        F.coalesce("item_users", F.lit(0.0)).alias("item_users"),
        F.coalesce("item_deep_users", F.lit(0.0)).alias("item_deep_users"),
        "item_conversion_rate",
        F.coalesce("item_events", F.lit(0.0)).alias("item_events"),
        F.col("item_users").isNull().cast("double").alias("item_is_new"),
        "user_items",
        "user_events",
        "user_deep_events",
        *stage_counts,
        "ui_hours_since_last",
        (F.coalesce("_category_weight", F.lit(0.0)) / F.col("_user_weight")).alias("category_affinity"),
        F.when(
            F.col("brand").isNotNull(), F.coalesce("_brand_weight", F.lit(0.0)) / F.col("_user_weight")
        ).alias("brand_affinity"),
        "price_band",
        F.abs(F.col("price_band") - F.col("_user_band")).alias("price_band_gap"),
    )


def token_features(cands: DataFrame, tokens: DataFrame, levels: Sequence[int]) -> DataFrame:
    """The hir_tokens group for every (user, item) of `cands`; tokens: bom_tokens rows of one model and day."""
    bags = tokens.select("node_id", "entity_type", "bom_level", "token", "weight", "rank")
    users = bags.where(F.col("entity_type") == "user").select(
        F.col("node_id").alias("user"), "bom_level", "token", F.col("weight").alias("uw")
    )
    items = bags.where(F.col("entity_type") == "item").select(
        F.col("node_id").alias("item"), "bom_level", "token", F.col("weight").alias("iw"), "rank"
    )
    shared = (
        cands.join(items, "item")
        .join(users, ["user", "bom_level", "token"])
        .groupBy("user", "item", "bom_level")
        .agg(
            F.sum(F.least("uw", "iw")).alias("overlap"),
            F.count(F.lit(1)).cast("double").alias("shared"),
            F.max(F.when(F.col("rank") == 1, F.col("uw"))).alias("on_top"),
        )
    )
    columns = []
    for level in levels:
        at = F.col("bom_level") == level
        columns += [
            F.sum(F.when(at, F.col("overlap"))).alias(f"tok_l{level}_overlap"),
            F.sum(F.when(at, F.col("shared"))).alias(f"tok_l{level}_shared"),
            F.max(F.when(at, F.col("on_top"))).alias(f"tok_l{level}_user_weight_on_item_token"),
        ]
    wide = shared.groupBy("user", "item").agg(*columns)
    has_bag = [
        users.select("user").distinct().withColumn("_user_bag", F.lit(True)),
        items.select("item").distinct().withColumn("_item_bag", F.lit(True)),
    ]
    out = (
        cands.join(wide, ["user", "item"], "left")
        .join(has_bag[0], "user", "left")
        .join(has_bag[1], "item", "left")
    )
    both = F.col("_user_bag") & F.col("_item_bag")  # no bag on a side: unknown (NaN), not "no overlap"
    selected = ["user", "item"]
    for level in levels:
        for name in ("overlap", "shared", "user_weight_on_item_token"):
            column = f"tok_l{level}_{name}"
            selected.append(F.when(both, F.coalesce(column, F.lit(0.0))).alias(column))
        selected.append(
            F.when(both, F.col(f"tok_l{level}_user_weight_on_item_token").isNotNull().cast("double")).alias(
                f"tok_l{level}_item_token_in_user_bag"
            )
        )
    return out.select(*selected)


def embedding_features(
    frame: pd.DataFrame,
    vectors: Mapping[int, np.ndarray],
    item_category: Mapping[int, object],
    item_brand: Mapping[int, object],
) -> pd.DataFrame:
    """hir_cosine, hir_category_cosine and hir_brand_cosine for the (user, item) rows of `frame`.

    vectors: node id -> L2-normalised HIR embedding (users and items). A category's (brand's) vector is the
    normalised mean of its items' embeddings."""
    dim = len(next(iter(vectors.values()))) if vectors else 0
    missing = np.full(dim, np.nan, np.float32)

    def matrix(ids) -> np.ndarray:
        return np.stack([vectors.get(int(i), missing) for i in ids]) if len(ids) else np.zeros((0, dim))

    def centroids(attribute: Mapping[int, object]) -> dict[object, np.ndarray]:
        sums: dict[object, np.ndarray] = {}
        for item, value in attribute.items():
            vector = vectors.get(int(item))
            if value is not None and vector is not None:
                sums[value] = sums.get(value, 0.0) + vector
        return {k: v / max(float(np.linalg.norm(v)), 1e-12) for k, v in sums.items()}

    users = matrix(frame["user"].to_numpy())
    out = pd.DataFrame({"user": frame["user"].to_numpy(), "item": frame["item"].to_numpy()})
    out["hir_cosine"] = (users * matrix(frame["item"].to_numpy())).sum(axis=1)
    for name, attribute in (("category", item_category), ("brand", item_brand)):
        means = centroids(attribute)
        keys = [attribute.get(int(i)) for i in frame["item"].tolist()]
        other = np.stack([means.get(k, missing) for k in keys]) if len(keys) else np.zeros((0, dim))
        out[f"hir_{name}_cosine"] = (users * other).sum(axis=1)
    return out


def feature_groups(generators: Sequence[str], levels: Sequence[int]) -> dict[str, list[str]]:
    """Group -> its feature columns, for the generators that ran and the quantiser's levels."""
    return {
        "generators": generator_columns(generators),
        "item": ["item_users", "item_deep_users", "item_conversion_rate", "item_events", "item_is_new"],
        "user": ["user_items", "user_events", "user_deep_events"],
        "user_item": [*(f"ui_{s}_events" for s in FUNNEL_STAGES), "ui_hours_since_last"],
        "affinity": ["category_affinity", "brand_affinity"],
        "price": ["price_band", "price_band_gap"],
        "hir_embedding": ["hir_cosine", "hir_rank", "hir_category_cosine", "hir_brand_cosine"],
        "hir_tokens": [
            f"tok_l{level}_{name}"
            for level in levels
            for name in ("overlap", "shared", "item_token_in_user_bag", "user_weight_on_item_token")
        ],
    }


def ranking_frame(
    spark: SparkSession,
    tops: Mapping[str, tuple[Mapping[int, np.ndarray], Mapping[int, np.ndarray]]],
    users: np.ndarray,
    targets: Mapping[int, set],
    per_generator: int,
    *,
    history: DataFrame,
    ui: DataFrame,
    catalog: DataFrame,
    tokens: DataFrame,
    vectors_for: Callable[[np.ndarray], Mapping[int, np.ndarray]],
) -> tuple[pd.DataFrame, dict[str, list[str]], DataFrame]:
    """(the candidate frame with label and every feature, sorted by user and item; feature groups; item
    attributes). tops: generator -> (user -> items, user -> scores) over the catalog; tokens: the bom_tokens rows
    of one model and day; vectors_for(node ids) -> their HIR embeddings."""
    frame = candidate_frame(tops, users, per_generator)
    # HIR's score is the user-item cosine: kept once, as hir_cosine (computed for every candidate).
    frame = frame.drop(columns=[c for c in ("hir_score",) if c in frame])
    frame["label"] = [
        float(item in targets.get(user, ()))
        for user, item in zip(frame["user"].tolist(), frame["item"].tolist(), strict=True)
    ]
    cands = spark.createDataFrame(frame[["user", "item"]]).cache()
    attributes = item_attributes(catalog).cache()
    levels = sorted(r["bom_level"] for r in tokens.select("bom_level").distinct().collect())
    base = base_features(cands, history, ui, attributes).toPandas()
    bags = token_features(cands, tokens, levels).toPandas()
    attrs = attributes.toPandas()
    vectors = vectors_for(np.unique(np.concatenate([frame["user"].to_numpy(), attrs["item"].to_numpy()])))
    embedding = embedding_features(
        frame,
        vectors,
        dict(zip(attrs["item"].tolist(), attrs["category"].tolist(), strict=True)),
        dict(zip(attrs["item"].tolist(), attrs["brand"].tolist(), strict=True)),
    )
    for extra in (base, bags, embedding):
        frame = frame.merge(extra, on=["user", "item"], how="left", validate="one_to_one")
    frame = frame.sort_values(["user", "item"], kind="stable").reset_index(drop=True)
    cands.unpersist()
    return frame, feature_groups([g for g in GENERATORS if g in tops], levels), attributes
