"""Synthetic event logs with planted hierarchical interests and known ground truth, at any scale.

Items belong to fine clusters (their category), fine clusters to parent clusters (the category's parent in
`category_code`), and each fine cluster has a few brands. A user belongs to one parent cluster and draws from two
fine interests inside it; 10% of views are noise from anywhere. Views convert with low probability (cart, then
purchase), more often inside the user's interests. Everything is computed from hashes of (seed, row), in Spark,
so generation is deterministic and scales with the cluster.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.sources.canonical import SourceRules

RULES = SourceRules(
    name="synthetic",
    stage_map={s: s for s in ("view", "favourite", "cart", "purchase")},
    timezone="UTC",
    numeric_ids=False,  # ids are u<n> / i<n> so they never clash with a real source's numeric ids
)

# Funnel rates: Taobao's slice has ~2.4% favourites, ~5.6% carts and ~2% purchases per event.
P_FAVOURITE = 0.03
P_CART_INTEREST, P_CART_NOISE = 0.06, 0.01
P_PURCHASE_GIVEN_CART = 0.4
P_NOISE = 0.10
P_PRIMARY = 0.6  # share of a user's on-interest views in its primary fine interest
BRANDS_PER_CLUSTER = 3


@dataclass(frozen=True)
class SyntheticSpec:
    users: int
    items: int
    events: int
    seed: int = 7
    parents: int = 8
    children: int = 4  # fine clusters per parent
    start: dt.date = dt.date(2026, 1, 1)
    days: int = 7

    @property
    def clusters(self) -> int:
        return self.parents * self.children

    @property
    def views(self) -> int:
        """Views to generate so that views plus the conversions they spawn come to about `events`."""
        cart = (1 - P_NOISE) * P_CART_INTEREST + P_NOISE * P_CART_NOISE
        per_view = 1 + P_FAVOURITE + cart * (1 + P_PURCHASE_GIVEN_CART)
        return max(1, round(self.events / per_view))


def uniform(seed: int, salt: str, *keys: Column) -> Column:
    """A deterministic uniform [0, 1) from a 64-bit hash of (seed, salt, keys)."""
    bits = F.xxhash64(F.lit(seed), F.lit(salt), *keys).bitwiseAND(F.lit((1 << 53) - 1))
    return bits.cast("double") / float(1 << 53)


def pick(seed: int, salt: str, n: Column | int, *keys: Column) -> Column:
    n_col = n if isinstance(n, Column) else F.lit(n)
    return F.floor(uniform(seed, salt, *keys) * n_col).cast("long")


def _user_interests(spec: SyntheticSpec, user: Column) -> tuple[Column, Column, Column]:
    parent = pick(spec.seed, "user_parent", spec.parents, user)
    first = parent * spec.children + pick(spec.seed, "user_c1", spec.children, user)
    second = parent * spec.children + pick(spec.seed, "user_c2", spec.children, user)
    return parent, first, second


def truth(spark: SparkSession, spec: SyntheticSpec) -> DataFrame:
    """The planted clusters of every user and item (table synthetic_truth)."""
    users = spark.range(spec.users).select(F.col("id").alias("u"))
    parent, first, second = _user_interests(spec, F.col("u"))
    users = users.select(
        F.lit("user").alias("entity_type"),
        F.concat(F.lit("u"), F.col("u")).alias("entity_id"),
        parent.cast("int").alias("parent_cluster"),
        first.cast("int").alias("cluster"),
        F.array_distinct(F.array(first.cast("int"), second.cast("int"))).alias("interests"),
    )
    items = spark.range(spec.items).select(
        F.lit("item").alias("entity_type"),
        F.concat(F.lit("i"), F.col("id")).alias("entity_id"),
        (F.col("id") % spec.clusters).cast("int").alias("cluster"),
    )
    items = items.select(
        "entity_type",
        "entity_id",
        (F.col("cluster") / spec.children).cast("int").alias("parent_cluster"),
        "cluster",
        F.array(F.col("cluster")).alias("interests"),
    )
    return users.unionByName(items).withColumn("seed", F.lit(spec.seed).cast("long"))


def stage(spark: SparkSession, spec: SyntheticSpec) -> DataFrame:
    """Staged events (see jobs.sources.canonical.STAGED_COLUMNS); every record is valid by construction."""
    seed, k = spec.seed, spec.clusters
    views = spark.range(spec.views).withColumnRenamed("id", "r")
    user = pick(seed, "user", spec.users, F.col("r"))
    views = views.withColumn("user", user)
    _, first, second = _user_interests(spec, F.col("user"))
    noise = uniform(seed, "noise", F.col("r")) < P_NOISE
    on_interest = F.when(uniform(seed, "primary", F.col("r")) < P_PRIMARY, first).otherwise(second)
    cluster = F.when(noise, pick(seed, "noise_cluster", k, F.col("r"))).otherwise(on_interest)
    views = views.withColumn("noise", noise).withColumn("cluster", cluster)
    # Items of cluster c are c, c + k, c + 2k, ...; a cubed uniform rank makes a few items popular (hubs).
    in_cluster = F.floor((F.lit(spec.items) - F.col("cluster") + k - 1) / k).cast("long")
    rank = F.floor(F.pow(uniform(seed, "item_rank", F.col("r")), 3) * in_cluster).cast("long")
    views = views.withColumn("item", F.col("cluster") + rank * k).where(F.col("item") < spec.items)
    offset = F.floor(uniform(seed, "time", F.col("r")) * (spec.days * 86400 - 600)).cast("long")
    start = int(dt.datetime(spec.start.year, spec.start.month, spec.start.day, tzinfo=dt.UTC).timestamp())
    views = views.withColumn("t", F.lit(start) + offset)

    p_cart = F.when(F.col("noise"), P_CART_NOISE).otherwise(P_CART_INTEREST)
    carted = uniform(seed, "cart", F.col("r")) < p_cart
    stages = F.array(
        F.struct(F.lit("view").alias("stage"), F.lit(0).alias("delay"), F.lit(True).alias("on")),
        F.struct(
            F.lit("favourite").alias("stage"),
            F.lit(60).alias("delay"),
            (uniform(seed, "fav", F.col("r")) < P_FAVOURITE).alias("on"),
        ),
        F.struct(F.lit("cart").alias("stage"), F.lit(120).alias("delay"), carted.alias("on")),
        F.struct(
            F.lit("purchase").alias("stage"),
            F.lit(300).alias("delay"),
            (carted & (uniform(seed, "buy", F.col("r")) < P_PURCHASE_GIVEN_CART)).alias("on"),
        ),
    )
    events = views.select("r", "user", "item", "t", F.explode(F.filter(stages, lambda s: s["on"])).alias("s"))
    parent = (F.col("item") % k / spec.children).cast("long")
    item_cluster = F.col("item") % k
    brand = F.concat(
        F.lit("brand"), item_cluster, F.lit("_"), pick(seed, "brand", BRANDS_PER_CLUSTER, F.col("item"))
    )
    price = F.format_number(F.lit(5.0) + uniform(seed, "price", F.col("item")) * 200, 2)
    events = events.select(
        F.concat(F.lit("u"), F.col("user")).alias("user_id"),
        F.concat(F.lit("i"), F.col("item")).alias("item_id"),
        F.col("s.stage").alias("event_type"),
        (F.col("t") + F.col("s.delay")).alias("epoch"),
        F.concat(F.lit("s"), F.col("r")).alias("session_id"),
        item_cluster.cast("string").alias("category_id"),
        F.concat(F.lit("topic"), parent, F.lit(".sub"), item_cluster).alias("category_code"),
        brand.alias("brand"),
        F.regexp_replace(price, ",", "").alias("price_raw"),
        F.concat(F.lit("item of topic"), parent, F.lit(" sub"), item_cluster).alias("title"),
    )
    record = F.concat_ws(
        ",", "user_id", "item_id", "event_type", "epoch", "session_id", "category_id", "brand"
    )
    return events.select(
        F.lit("synthetic").alias("input_file"),
        record.alias("record"),
        record.alias("dedup_key"),
        F.lit(None).cast("string").alias("structural_reason"),
        "user_id",
        "item_id",
        "event_type",
        F.col("epoch").cast("string").alias("time_raw"),
        F.timestamp_seconds(F.col("epoch")).alias("event_time"),
        "session_id",
        "category_id",
        "category_code",
        "brand",
        "price_raw",
        "title",
    )
