"""Build the day's heterogeneous graph: `nodes` and `edges` from a window of `events` and `entities`.

    spark-submit jobs/build_graph.py --ds 2017-12-03 --warehouse warehouse/taobao
    hir build-graph --ds 2019-10-01 --warehouse warehouse/rees46 --lookback-days 30 --half-life-days 7
    hir build-graph --ds 2026-01-07 --degree-cap 0 --stage-weights view=1,favourite=1,cart=1,purchase=1

The graph of day ds reads the events of [ds - lookback_days, ds], never one after ds, and the latest attributes
of each item seen in that window.

* Nodes: user, item, advertiser (brand) and category. A node's key is (source, node_type, raw_id), so several
  sources can share a warehouse; node_id is the 64-bit xxhash64 of that key: the same on every day and in every
  run, checked for collisions (the job fails naming both keys) and never 0, the padding id of the model.
* Categories: an item links to its leaf category, keyed by category_id (every source has it); the leaf links to
  each level of its category_code as parents, finest first: leaf '2053013552326770905' -> 'appliances.kitchen.mixer'
  -> 'appliances.kitchen' -> 'appliances'. Where the source has no code (Taobao) the leaf is the only level.
* Edges: user-item per funnel stage (view, favourite, cart, purchase; 'removal' events are ignored), item-category,
  item-advertiser and category-parent, each with its reverse. A user-item edge weighs the sum over its events of
  stage weight x 0.5^(age / half-life), age in days from the event's day to ds; an attribute edge carries the
  same sums of its member side (the item, or every item under a child category), so a category or a brand ranks
  its busy items first. Each edge keeps its event count, first and last time, a recency bucket and its funnel
  ('upper', 'deep' or 'attribute').
* Hub control: at most --degree-cap edges per (src, edge type), the heaviest, chosen with a salted two-stage
  top-k (jobs.graph.topk) so a hub with millions of edges is not one task. nodes.degree counts before the cap.

The job prints the reconciliation: events in the window = events behind the user-item edges + ignored events
(removals), and exits 1 when it does not hold. A rerun of a day replaces that day's partition.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, parse_stage_weights, run_job
from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.common.stage import StageLog
from jobs.graph.topk import DEFAULT_SALTS, top_k
from schemas.codes import DEFAULT_STAGE_WEIGHTS, FUNNEL_DEPTH, STAGE_EDGE
from schemas.tables import EDGES, ENTITIES, EVENTS, NODES

# Weights are summed as integers in units of 1e-9: integer sums do not depend on the order Spark adds partial
# aggregates in, so a rerun gives bit-identical weights (and identical samples downstream).
WEIGHT_UNITS = 1_000_000_000
# First day of each recency bucket: one bucket per day for a week, then quarter-octaves (8 * 2^(i/4) rounded up),
# the last bucket holding 27 days and older. 16 buckets = hir_model ModelConfig.num_recency_buckets.
RECENCY_BUCKET_STARTS: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 23, 27)

ATTRIBUTE_EDGES: dict[str, tuple[str, str]] = {  # relation -> (forward, reverse) edge type
    "category": ("item_in_category", "category_has_item"),
    "advertiser": ("item_of_advertiser", "advertiser_has_item"),
    "parent": ("category_child_of", "category_parent_of"),
}
REVERSE_EDGE_TYPE: dict[str, str] = dict([*STAGE_EDGE.values(), *ATTRIBUTE_EDGES.values()])
# Columns of an edge keyed by raw ids, before node ids are assigned.
_RAW_EDGE_COLUMNS = (
    "source",
    "src_type",
    "src_raw",
    "dst_type",
    "dst_raw",
    "edge_type",
    "funnel",
    "weight_units",
    "event_count",
    "first_time",
    "last_time",
    "last_ds",
)
_ACTIVITY = ("weight_units", "event_count", "first_time", "last_time", "last_ds")


@dataclass(frozen=True)
class GraphConfig:
    ds: dt.date
    warehouse: str = "warehouse"
    lookback_days: int = 30
    half_life_days: float = 7.0
    stage_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_STAGE_WEIGHTS))
    degree_cap: int = 500
    salts: int = DEFAULT_SALTS

    @property
    def start(self) -> dt.date:
        return self.ds - dt.timedelta(days=self.lookback_days)

    @property
    def day_slice(self) -> str:
        return f"ds = DATE'{self.ds.isoformat()}'"


@dataclass(frozen=True)
class GraphReport:
    ds: dt.date
    events_in: dict[str, int]  # events in the window per funnel stage (removal included)
    edge_events: dict[str, int]  # sum of event_count of the user->item (and item->user) edges, before the cap
    nodes: dict[str, int]  # written, per node type
    edges: dict[str, int]  # written, per edge type
    capped: dict[str, int]  # dropped by the degree cap, per edge type
    versions: dict[str, int] = field(default_factory=dict)

    @property
    def graph_events(self) -> int:
        return sum(n for stage, n in self.events_in.items() if stage in STAGE_EDGE)

    @property
    def ignored_events(self) -> int:
        return sum(n for stage, n in self.events_in.items() if stage not in STAGE_EDGE)

    @property
    def reconciles(self) -> bool:
        return (
            self.edge_events.get("user_item", 0) == self.graph_events == self.edge_events.get("item_user", 0)
        )

    def line(self) -> str:
        total = sum(self.events_in.values())
        verdict = "reconciled" if self.reconciles else "DOES NOT RECONCILE"
        return (
            f"graph {self.ds}: events {total} = in user-item edges {self.edge_events.get('user_item', 0)} "
            f"+ ignored {self.ignored_events} ({verdict}); nodes {sum(self.nodes.values())}, "
            f"edges {sum(self.edges.values())} (degree cap dropped {sum(self.capped.values())})"
        )


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir build-graph", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--ds", type=parse_ds, required=True, help="Day of the graph (YYYY-MM-DD); no later event is read."
    )
    add_warehouse_flag(p)
    p.add_argument(
        "--lookback-days",
        type=int,
        default=30,
        help="Days before ds whose events enter the graph. 30 covers a monthly buying cycle; with the default "
        "half-life the oldest day still weighs 5%%.",
    )
    p.add_argument(
        "--half-life-days",
        type=float,
        default=7.0,
        help="Recency decay: an event loses half its weight every this many days. A week keeps a shopping "
        "mission (days) at full strength and fades last month's.",
    )
    p.add_argument(
        "--stage-weights",
        default=",".join(f"{s}={w:g}" for s, w in DEFAULT_STAGE_WEIGHTS.items()),
        help="Weight of one event per funnel stage. Default 1/2/3/5: deeper stages carry more intent, the same "
        "scale the model's synthetic data uses.",
    )
    p.add_argument(
        "--degree-cap",
        type=int,
        default=500,
        help="Most edges kept per (node, edge type), the heaviest; 0 keeps all. 500 is >100x the sampler's k1, "
        "so sampling still varies, while a hub with millions of users keeps a bounded list.",
    )
    p.add_argument(
        "--salts",
        type=int,
        default=DEFAULT_SALTS,
        help="Salts of the two-stage top-k behind the degree cap: a hub's edges are ranked in this many tasks. "
        "32 splits a hub 32 ways; an ordinary node's few edges cost the same either way.",
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> GraphConfig:
    args = build_parser().parse_args(argv)
    if args.lookback_days < 0:
        raise HirError("--lookback-days must be 0 or more")
    if not args.half_life_days > 0:
        raise HirError("--half-life-days must be positive")
    if args.degree_cap < 0:
        raise HirError("--degree-cap must be 0 (no cap) or more")
    if args.salts < 1:
        raise HirError("--salts must be 1 or more")
    return GraphConfig(
        ds=args.ds,
        warehouse=args.warehouse,
        lookback_days=args.lookback_days,
        half_life_days=args.half_life_days,
        stage_weights=parse_stage_weights(args.stage_weights, "--stage-weights"),
        degree_cap=args.degree_cap,
        salts=args.salts,
    )


# --- ids, weights, recency -------------------------------------------------------------------------------------


def node_id(source: Column, node_type: Column, raw_id: Column) -> Column:
    """64-bit id of a node key; a key hashing to 0 (the padding id, odds 2^-64) takes a second, salted hash."""
    h = F.xxhash64(source, node_type, raw_id)
    return F.when(h != 0, h).otherwise(F.xxhash64(F.lit("hir-node-id-not-zero"), source, node_type, raw_id))


def recency_bucket(age_days: Column) -> Column:
    """Bucket of an age in days (RECENCY_BUCKET_STARTS): exact integer comparisons, no floating log."""
    starts = F.array(*[F.lit(s) for s in RECENCY_BUCKET_STARTS])
    return (F.size(F.filter(starts, lambda start: start <= age_days)) - 1).cast("int")


def event_weight_units(cfg: GraphConfig) -> Column:
    """Stage weight x 0.5^(age / half-life) of one event, as an integer number of 1e-9 units (at least 1)."""
    stage_weight = F.lit(None).cast("double")
    for stage, weight in cfg.stage_weights.items():
        stage_weight = F.when(F.col("funnel_stage") == stage, F.lit(float(weight))).otherwise(stage_weight)
    age = F.datediff(F.lit(cfg.ds), F.col("ds"))
    decayed = stage_weight * F.pow(F.lit(0.5), age / F.lit(cfg.half_life_days))
    return F.greatest(F.round(decayed * WEIGHT_UNITS).cast("long"), F.lit(1).cast("long"))


def in_window(df: DataFrame, cfg: GraphConfig) -> DataFrame:
    """Rows whose ds lies in [ds - lookback_days, ds]: nothing after ds ever enters the graph."""
    return df.where(F.col("ds").between(F.lit(cfg.start), F.lit(cfg.ds)))


# --- edges ---------------------------------------------------------------------------------------------------------


def interaction_edges(events: DataFrame, cfg: GraphConfig) -> DataFrame:
    """user -> item edges, one per (user, item, funnel stage) of the window's events, raw-keyed."""
    graph_events = in_window(events, cfg).where(F.col("funnel_stage").isin(list(STAGE_EDGE)))
    pairs = graph_events.groupBy("source", "user_id", "item_id", "funnel_stage").agg(
        F.sum(event_weight_units(cfg)).alias("weight_units"),
        F.count(F.lit(1)).alias("event_count"),
        F.min("event_time").alias("first_time"),
        F.max("event_time").alias("last_time"),
        F.max("ds").alias("last_ds"),
    )
    forward = F.lit(None).cast("string")
    funnel = F.lit(None).cast("string")
    for stage, (edge_type, _) in STAGE_EDGE.items():
        forward = F.when(F.col("funnel_stage") == stage, F.lit(edge_type)).otherwise(forward)
        funnel = F.when(F.col("funnel_stage") == stage, F.lit(FUNNEL_DEPTH[stage])).otherwise(funnel)
    return pairs.select(
        "source",
        F.lit("user").alias("src_type"),
        F.col("user_id").alias("src_raw"),
        F.lit("item").alias("dst_type"),
        F.col("item_id").alias("dst_raw"),
        forward.alias("edge_type"),
        funnel.alias("funnel"),
        *_ACTIVITY,
    )


def with_reverse(forward: DataFrame) -> DataFrame:
    """Every edge and its reverse (dst -> src, reverse edge type, same weight and counts), in one pass."""
    reverse_type = F.lit(None).cast("string")
    for forward_type, backward_type in REVERSE_EDGE_TYPE.items():
        reverse_type = F.when(F.col("edge_type") == forward_type, F.lit(backward_type)).otherwise(
            reverse_type
        )
    ends = ("src_type", "src_raw", "dst_type", "dst_raw", "edge_type")
    both = F.array(
        F.struct(*[F.col(c) for c in ends]),
        F.struct(
            F.col("dst_type").alias("src_type"),
            F.col("dst_raw").alias("src_raw"),
            F.col("src_type").alias("dst_type"),
            F.col("src_raw").alias("dst_raw"),
            reverse_type.alias("edge_type"),
        ),
    )
    return forward.select("source", F.explode(both).alias("end"), "funnel", *_ACTIVITY).select(
        "source", *[F.col(f"end.{c}").alias(c) for c in ends], "funnel", *_ACTIVITY
    )


def item_attributes(entities: DataFrame, cfg: GraphConfig) -> DataFrame:
    """Per (source, item): the latest category (id and code together) and the latest brand seen in the window."""

    def latest(value: Column, *fields: str) -> Column:
        return F.max(F.when(value, F.struct("ds", "last_seen", *fields)))

    items = in_window(entities, cfg).where(F.col("entity_type") == "item")
    has_category = F.col("category_id").isNotNull() | F.col("category_code").isNotNull()
    latest_rows = items.groupBy("source", F.col("entity_id").alias("item_id")).agg(
        latest(has_category, "category_id", "category_code").alias("category"),
        latest(F.col("brand").isNotNull(), "brand").alias("advertiser"),
        F.max(F.struct("ds", "last_seen")).alias("seen"),
    )
    return latest_rows.select(
        "source",
        "item_id",
        F.col("category.category_id").alias("category_id"),
        F.col("category.category_code").alias("category_code"),
        F.col("advertiser.brand").alias("brand"),
        F.col("seen.last_seen").alias("seen_time"),
        F.col("seen.ds").alias("seen_ds"),
    )


def category_chain(category_id: Column, category_code: Column) -> Column:
    """[leaf, code, code's parent, ..., root]: the leaf is category_id (the code where there is no id)."""
    parts = F.filter(F.split(F.coalesce(category_code, F.lit("")), r"\."), lambda part: part != "")
    prefixes = F.transform(
        F.sequence(F.lit(1), F.greatest(F.size(parts), F.lit(1))),
        lambda i: F.array_join(F.slice(parts, F.lit(1), i), "."),
    )
    levels = F.when(F.size(parts) > 0, F.reverse(prefixes)).otherwise(F.array().cast("array<string>"))
    leaf = F.coalesce(category_id, category_code)
    return F.when(leaf.isNull(), F.array().cast("array<string>")).otherwise(
        F.array_distinct(F.concat(F.array(leaf), levels))
    )


def _activity_sums() -> list[Column]:
    return [
        F.sum("weight_units").alias("weight_units"),
        F.sum("event_count").alias("event_count"),
        F.min("first_time").alias("first_time"),
        F.max("last_time").alias("last_time"),
        F.max("last_ds").alias("last_ds"),
    ]


def _raw_edge(relation: str, src_type: str, src: Column, dst_type: str, dst: Column) -> Column:
    return F.struct(
        F.lit(src_type).alias("src_type"),
        src.alias("src_raw"),
        F.lit(dst_type).alias("dst_type"),
        dst.alias("dst_raw"),
        F.lit(ATTRIBUTE_EDGES[relation][0]).alias("edge_type"),
    )


def attribute_edges(interactions: DataFrame, attributes: DataFrame) -> DataFrame:
    """Forward item->category, item->advertiser and category->parent edges, weighted by member activity.

    A catalog item (attributes in the window, no interaction yet: a new ad, a new product) still gets its
    attribute edges, with the least weight (1 unit), no events and its catalog row's time, so it has a node,
    a neighbourhood and an embedding from its category, brand and content before anyone has clicked it.
    """
    activity = interactions.groupBy("source", F.col("dst_raw").alias("item_id")).agg(*_activity_sums())
    catalog_only = F.col("event_count").isNull()
    items = (
        activity.join(attributes, ["source", "item_id"], "full")
        .select(
            "source",
            "item_id",
            "category_id",
            "category_code",
            "brand",
            F.when(catalog_only, F.lit(1).cast("long"))
            .otherwise(F.col("weight_units"))
            .alias("weight_units"),
            F.coalesce("event_count", F.lit(0).cast("long")).alias("event_count"),
            F.coalesce("first_time", "seen_time").alias("first_time"),
            F.coalesce("last_time", "seen_time").alias("last_time"),
            F.coalesce("last_ds", "seen_ds").alias("last_ds"),
        )
        .withColumn("chain", category_chain(F.col("category_id"), F.col("category_code")))
    )
    memberships = F.filter(
        F.array(
            _raw_edge("category", "item", F.col("item_id"), "category", F.get("chain", 0)),
            _raw_edge("advertiser", "item", F.col("item_id"), "advertiser", F.col("brand")),
        ),
        lambda e: e["dst_raw"].isNotNull(),
    )
    item_edges = items.select("source", F.explode(memberships).alias("edge"), *_ACTIVITY)
    # child -> parent along each item's chain; a link weighs the activity of the items under it.
    links = F.transform(
        F.sequence(F.lit(0), F.greatest(F.size("chain") - 2, F.lit(0))),
        lambda i: _raw_edge("parent", "category", F.get("chain", i), "category", F.get("chain", i + 1)),
    )
    link_edges = (
        items.where(F.size("chain") > 1)
        .select("source", F.explode(links).alias("edge"), *_ACTIVITY)
        .groupBy("source", "edge")
        .agg(*_activity_sums())
    )
    return (
        item_edges.unionByName(link_edges)
        .select("source", "edge.*", F.lit("attribute").alias("funnel"), *_ACTIVITY)
        .select(*_RAW_EDGE_COLUMNS)
    )


def graph_edges(events: DataFrame, entities: DataFrame, cfg: GraphConfig) -> DataFrame:
    """Every edge of the day's graph before the degree cap, with node ids, weight, recency bucket.

    Keeps the raw keys (source, src_raw, dst_raw) and the exact integer `weight_units` for the steps after it.
    """
    interactions = interaction_edges(events, cfg)
    forward = interactions.unionByName(attribute_edges(interactions, item_attributes(entities, cfg)))
    raw = with_reverse(forward.select(*_RAW_EDGE_COLUMNS))
    return raw.select(
        node_id(F.col("source"), F.col("src_type"), F.col("src_raw")).alias("src"),
        node_id(F.col("source"), F.col("dst_type"), F.col("dst_raw")).alias("dst"),
        "source",
        "src_type",
        "src_raw",
        "dst_type",
        "dst_raw",
        "edge_type",
        "funnel",
        "weight_units",
        (F.col("weight_units") / F.lit(float(WEIGHT_UNITS))).alias("weight"),
        "event_count",
        "first_time",
        "last_time",
        recency_bucket(F.datediff(F.lit(cfg.ds), F.col("last_ds"))).alias("recency_bucket"),
    )


def graph_nodes(edges: DataFrame) -> DataFrame:
    """One row per node (every node is the source of an edge: each edge has its reverse), degree before the cap."""
    return (
        edges.groupBy("src", "source", "src_type", "src_raw")
        .agg(F.count(F.lit(1)).alias("degree"))
        .select(
            F.col("src").alias("node_id"),
            "source",
            F.col("src_type").alias("node_type"),
            F.col("src_raw").alias("raw_id"),
            "degree",
        )
    )


def node_stats(nodes: DataFrame) -> dict[str, int]:
    """Nodes per type; fails, naming both keys, when two node keys share an id or a node got the padding id 0.

    One pass: distinct ids are counted with the nodes, and only a failed count looks for the colliding keys.
    """
    stats = {
        r["node_type"]: (int(r["keys"]), int(r["ids"]), int(r["zero"]))
        for r in nodes.rollup("node_type")
        .agg(
            F.count(F.lit(1)).alias("keys"),
            F.count_distinct("node_id").alias("ids"),
            F.count_if(F.col("node_id") == 0).alias("zero"),
        )
        .collect()
    }
    keys, ids, zero = stats.pop(None, (0, 0, 0))
    if keys != ids or zero:
        check_node_ids(nodes)
    return {node_type: n for node_type, (n, _, _) in stats.items()}


def check_node_ids(nodes: DataFrame) -> None:
    """Fail, naming both keys, when two node keys share an id (or a node got the padding id 0)."""
    clash = (
        nodes.groupBy("node_id")
        .agg(
            F.count(F.lit(1)).alias("keys"),
            F.min(F.struct("source", "node_type", "raw_id")).alias("first"),
            F.max(F.struct("source", "node_type", "raw_id")).alias("last"),
        )
        .where((F.col("keys") > 1) | (F.col("node_id") == 0))
        .limit(1)
        .collect()
    )
    if clash:
        row = clash[0]
        first, last = (":".join(row[side]) for side in ("first", "last"))
        raise HirError(
            f"node id {row['node_id']} is shared by {row['keys']} node keys ({first}, {last}): a 64-bit hash "
            "collision (or the padding id 0); nothing written"
        )


def cap_degree(edges: DataFrame, cfg: GraphConfig) -> DataFrame:
    """The heaviest `degree_cap` edges per (src, edge type), ranked (rank_in_type); all of them when the cap is 0."""
    order = [F.col("weight_units").desc()]
    if cfg.degree_cap == 0:
        return top_k(edges, ["src", "edge_type"], order, "dst", 2**31 - 1, "rank_in_type", salts=1)
    return top_k(edges, ["src", "edge_type"], order, "dst", cfg.degree_cap, "rank_in_type", salts=cfg.salts)


# --- the job -------------------------------------------------------------------------------------------------------


def _counts(df: DataFrame, key: str, value: Column | None = None) -> dict[str, int]:
    value = F.count(F.lit(1)) if value is None else value
    return {r[0]: int(r[1]) for r in df.groupBy(key).agg(value.alias("n")).collect()}


def build_graph(spark: SparkSession, cfg: GraphConfig) -> GraphReport:
    """Read the window, build, check and write the day's nodes and edges; return the reconciliation."""
    log = StageLog("build_graph", {"ds": cfg.ds.isoformat(), "window_start": cfg.start.isoformat()})
    events = in_window(read_table(spark, EVENTS, cfg.warehouse), cfg)
    entities = read_table(spark, ENTITIES, cfg.warehouse)
    events_in = _counts(events, "funnel_stage")
    if sum(events_in.values()) == 0:
        raise HirError(
            f"no events between {cfg.start} and {cfg.ds} in {cfg.warehouse}: run `hir ingest` first"
        )
    if not any(stage in STAGE_EDGE for stage in events_in):
        raise HirError(
            f"no view/favourite/cart/purchase events between {cfg.start} and {cfg.ds}: empty graph"
        )

    edges = graph_edges(events, entities, cfg).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        before_cap = {
            r["edge_type"]: (int(r["edges"]), int(r["events"]))
            for r in edges.groupBy("edge_type")
            .agg(F.count(F.lit(1)).alias("edges"), F.sum("event_count").alias("events"))
            .collect()
        }
        nodes = graph_nodes(edges)
        node_counts = node_stats(nodes)
        day = F.lit(cfg.ds).alias("ds")
        versions = {
            "nodes": write_table(nodes.select("*", day), NODES, cfg.warehouse, cfg.day_slice),
            "edges": write_table(
                cap_degree(edges, cfg).select(*[c for c in EDGES.columns if c != "ds"], day),
                EDGES,
                cfg.warehouse,
                cfg.day_slice,
            ),
        }
    finally:
        edges.unpersist()
    written_edges = _counts(read_table(spark, EDGES, cfg.warehouse).where(cfg.day_slice), "edge_type")
    forward_types = {edge_type for edge_type, _ in STAGE_EDGE.values()}
    reverse_types = {edge_type for _, edge_type in STAGE_EDGE.values()}
    report = GraphReport(
        ds=cfg.ds,
        events_in=events_in,
        edge_events={
            "user_item": sum(n for t, (_, n) in before_cap.items() if t in forward_types),
            "item_user": sum(n for t, (_, n) in before_cap.items() if t in reverse_types),
        },
        nodes=node_counts,
        edges=written_edges,
        capped={
            t: n - written_edges.get(t, 0) for t, (n, _) in before_cap.items() if n > written_edges.get(t, 0)
        },
        versions=versions,
    )
    log.counts.update(
        rows_in=sum(events_in.values()),
        rows_in_by_stage=events_in,
        ignored_events=report.ignored_events,
        nodes_out=node_counts,
        edges_out=written_edges,
        capped_edges=report.capped,
        reconciled=report.reconciles,
    )
    log.emit()
    return report


def format_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    spark = get_spark("hir-build-graph", places={"--warehouse": cfg.warehouse})
    report = build_graph(spark, cfg)
    print(report.line())
    print(f"  nodes: {format_counts(report.nodes)}")
    print(f"  edges: {format_counts(report.edges)}")
    if report.capped:
        print(f"  dropped by --degree-cap {cfg.degree_cap}: {format_counts(report.capped)}")
    return 0 if report.reconciles else 1


if __name__ == "__main__":
    sys.exit(run_job(main))
