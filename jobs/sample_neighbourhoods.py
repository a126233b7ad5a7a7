"""Sample each target node's hierarchical neighbourhood from the day's graph into `neighbourhoods`.

    spark-submit jobs/sample_neighbourhoods.py --ds 2017-12-03 --warehouse warehouse/taobao
    hir sample-neighbourhoods --ds 2019-10-01 --warehouse warehouse/rees46 --k1 4 --k2 2 --max-tokens 64
    hir sample-neighbourhoods --ds 2019-10-01 --node-types user,item,advertiser,category --seed 1

For every node of the chosen types (`nodes` of ds), one row: the target at position 0, then up to k1 hop-1
neighbours per edge type, then up to k2 hop-2 neighbours under each hop-1 neighbour, padded to --max-tokens.

* Sampling is weighted and without replacement (Efraimidis-Spirakis): each edge gets the key log(u) / weight and a
  node keeps the edges with the largest keys. u comes from a 64-bit hash of (seed, src, dst, edge type), never
  from rand(), so a rerun, or a task Spark recomputes, draws the same sample. ds is not in the hash: recency decay
  scales all of a node's edge weights by the same factor from one day to the next, so a node whose edges did not
  change keeps its sample, and with it its embedding and tokens (representation_drift's "unchanged" cohort).
* Hop-1: the top k1 keys per (target, edge type). Hop-2 under a hop-1 node n: the top k2 keys among n's
  neighbours, over all of n's edge types, one token per distinct neighbour (a neighbour linked by several edge
  types keeps its largest key: the maximum of ES keys is the ES key of the summed weight, so this samples nodes
  by total weight), never the target itself. A node's hop-2 draw is the same under every target that reaches it.
* Top-k per node is the salted two-stage top-k of jobs.graph.topk: exact, and a hub's edges are ranked in
  --salts tasks instead of one.
* Token order: hop-1 round-robin over edge types (every type's best, then every type's second ...), then hop-2
  round-robin over parents, so a row cut at --max-tokens loses the weakest draws of every branch, not whole
  branches. Token fields follow schemas.tables.NEIGHBOURHOODS; padding is node 0, type 0, parent -1.

A node with no edges (cold) gets a row with the target only; a user with views only gets view tokens.
A rerun of a day replaces that day's partition.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, run_job
from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.common.stage import StageLog
from jobs.graph.topk import DEFAULT_SALTS, top_k
from schemas.codes import EDGE_TYPES, NODE_TYPES, PAD
from schemas.tables import EDGES, NEIGHBOURHOODS, NODES

_U_BITS = 53  # a double holds 53 bits exactly: u = (h + 0.5) / 2^53 lies strictly inside (0, 1)

TOKEN_FIELDS = ("node_id", "node_type", "edge_type", "hop", "parent_pos", "recency", "weight", "is_deep")


@dataclass(frozen=True)
class SampleConfig:
    ds: dt.date
    warehouse: str = "warehouse"
    node_types: tuple[str, ...] = ("user", "item")
    k1: int = 4
    k2: int = 2
    user_k1: int | None = None  # hop-1 budget per edge type of a user target; None: sized from the data
    max_tokens: int = 64
    seed: int = 0
    salts: int = DEFAULT_SALTS

    @property
    def day_slice(self) -> str:
        return f"ds = DATE'{self.ds.isoformat()}'"


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir sample-neighbourhoods", description=__doc__.split("\n\n")[0])
    p.add_argument("--ds", type=parse_ds, required=True, help="Day of the graph to sample (YYYY-MM-DD).")
    add_warehouse_flag(p)
    p.add_argument(
        "--node-types",
        default="user,item",
        help="Comma-separated target node types. Users and items are what ranking and retrieval read; add "
        "advertiser,category for their embeddings.",
    )
    p.add_argument(
        "--k1",
        type=int,
        default=4,
        help="Hop-1 neighbours per edge type. With --k2 2 an item (6 edge types) fills at most 1 + 18 + 36 = 55 "
        "tokens: every branch fits the model's default 64.",
    )
    p.add_argument(
        "--user-k1",
        default="auto",
        help="Hop-1 neighbours per edge type of a user target: a user's row is its history, and the model can "
        "only point at the items it holds. 'auto' (default): the 90th percentile of the users' distinct items "
        "per edge type in the day's graph, at least --k1 and at most --max-tokens - 1.",
    )
    p.add_argument(
        "--k2",
        type=int,
        default=2,
        help="Hop-2 neighbours under each hop-1 neighbour; 2 shows a neighbour's context (an item's category "
        "and a co-viewer) at half the tokens of hop 1.",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=64,
        help="Row length with the target (hir_model ModelConfig.max_tokens, default 64); longer rows lose the "
        "weakest draws first.",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Seed of the sampling hash; the same seed and edges give the same sample, on any day. Change it for "
        "another, equally valid, draw.",
    )
    p.add_argument(
        "--salts",
        type=int,
        default=DEFAULT_SALTS,
        help="Salts of the two-stage top-k: a hub's edges are ranked in this many tasks. "
        "32 splits a hub 32 ways; an ordinary node's few edges cost the same either way.",
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> SampleConfig:
    args = build_parser().parse_args(argv)
    node_types = tuple(t.strip() for t in args.node_types.split(",") if t.strip())
    unknown = [t for t in node_types if t not in NODE_TYPES]
    if not node_types or unknown:
        raise HirError(
            f"--node-types: unknown type '{(unknown or [''])[0]}' (choose from {', '.join(NODE_TYPES)})"
        )
    if args.k1 < 1 or args.k2 < 0:
        raise HirError("--k1 must be 1 or more and --k2 0 or more")
    user_k1 = None
    if args.user_k1 != "auto":
        try:
            user_k1 = int(args.user_k1)
        except ValueError:
            raise HirError(f"--user-k1 must be 'auto' or a number, not '{args.user_k1}'") from None
        if user_k1 < 1:
            raise HirError("--user-k1 must be 1 or more")
    if args.max_tokens < 2:
        raise HirError("--max-tokens must be 2 or more (the target and one neighbour)")
    if args.salts < 1:
        raise HirError("--salts must be 1 or more")
    return SampleConfig(
        ds=args.ds,
        warehouse=args.warehouse,
        node_types=node_types,
        k1=args.k1,
        k2=args.k2,
        user_k1=user_k1,
        max_tokens=args.max_tokens,
        seed=args.seed,
        salts=args.salts,
    )


# --- sampling keys and candidates ------------------------------------------------------------------------------


def _code(names: Column, codes: dict[str, int], what: str) -> Column:
    """The integer code of a type name; an unknown name stops the job (the graph and schemas.codes disagree)."""
    code = F.raise_error(F.concat(F.lit(f"unknown {what} '"), names, F.lit("' (not in schemas.codes)")))
    for name, value in codes.items():
        code = F.when(names == name, F.lit(value)).otherwise(code)
    return code.cast("int")


def sampling_key(seed: int, weight: Column) -> Column:
    """Efraimidis-Spirakis key log(u) / weight, u uniform in (0, 1) from a hash of (seed, src, dst, type)."""
    bits = F.xxhash64(F.lit(seed), "src", "dst", "edge_type")
    u = (bits.bitwiseAND(F.lit((1 << _U_BITS) - 1)).cast("double") + 0.5) / float(1 << _U_BITS)
    return F.log(u) / weight


def keyed_edges(edges: DataFrame, cfg: SampleConfig) -> DataFrame:
    """Edges with their sampling key and token fields (codes, recency, weight as float, deep flag)."""
    return edges.where(F.col("weight") > 0).select(
        "src",
        "src_type",
        "dst",
        "edge_type",
        sampling_key(cfg.seed, F.col("weight")).alias("key"),
        _code(F.col("dst_type"), NODE_TYPES, "node type").alias("node_type"),
        _code(F.col("edge_type"), EDGE_TYPES, "edge type").alias("edge_code"),
        F.col("recency_bucket").alias("recency"),
        F.col("weight").cast("float").alias("weight"),
        (F.col("funnel") == "deep").alias("is_deep"),
    )


def user_budget(edges: DataFrame, cfg: SampleConfig) -> int:
    """Hop-1 tokens per edge type of a user: --user-k1, or the 90th percentile of the users' distinct items per
    edge type (the largest over types), within [k1, max_tokens - 1]."""
    if cfg.user_k1 is not None:
        return min(cfg.user_k1, cfg.max_tokens - 1)
    degrees = (
        edges.where((F.col("src_type") == "user") & (F.col("weight") > 0))
        .groupBy("src", "edge_type")
        .agg(F.countDistinct("dst").alias("items"))
        .groupBy("edge_type")
        .agg(F.percentile("items", 0.9).alias("p90"))
        .collect()
    )
    p90 = max((int(round(r["p90"])) for r in degrees), default=cfg.k1)
    return max(cfg.k1, min(p90, cfg.max_tokens - 1))


def draw(edges: DataFrame, cfg: SampleConfig, k: int | None = None) -> DataFrame:
    """Each node's top-k keys per edge type (rank 1 = drawn first): the weighted sample without replacement.

    k defaults to what both hops need: k1 for hop 1 (the user budget for users), k2 + 1 for hop 2 (one more, in
    case the target is among them).
    """
    k = max(cfg.k1, cfg.user_k1 or 0, cfg.k2 + 1) if k is None else k
    return top_k(
        keyed_edges(edges, cfg), ["src", "edge_type"], [F.col("key").desc()], "dst", k, "rank", cfg.salts
    )


def hop2_lists(drawn: DataFrame, cfg: SampleConfig) -> DataFrame:
    """Per node: its k2 + 1 best distinct neighbours over all edge types (exact from the per-type top lists).

    A neighbour reached by several edge types keeps its largest key. Exact: if a neighbour's best edge ranks r in
    its type, r - 1 other neighbours beat it, so the per-type top k2 + 1 holds every one of the top k2 + 1.
    """
    best = drawn.groupBy("src", "dst").agg(
        F.max(F.struct("key", "edge_code", "node_type", "recency", "weight", "is_deep")).alias("best")
    )
    best = best.select("src", "dst", "best.*")
    # At most (edge types x k) rows per node: a plain window is not skewed here.
    return top_k(best, ["src"], [F.col("key").desc()], "dst", cfg.k2 + 1, "rank", salts=1)


# --- tokens --------------------------------------------------------------------------------------------------------


def _token(*values: Column | str | int | float | bool) -> Column:
    """A token struct from its fields in TOKEN_FIELDS order: columns, column names, or literal values."""
    casts = ("long", "int", "int", "int", "int", "int", "float", "boolean")

    def column(value: Column | str | int | float | bool) -> Column:
        if isinstance(value, Column):
            return value
        return F.col(value) if isinstance(value, str) else F.lit(value)

    return F.struct(
        *[column(v).cast(c).alias(name) for v, c, name in zip(values, casts, TOKEN_FIELDS, strict=True)]
    )


PAD_TOKEN = (0, PAD, PAD, 0, -1, 0, 0.0, False)


def sample_neighbourhoods(nodes: DataFrame, edges: DataFrame, cfg: SampleConfig) -> DataFrame:
    """One neighbourhood row per target node (nodes of cfg.node_types), columns as NEIGHBOURHOODS without ds."""
    targets = nodes.where(F.col("node_type").isin(list(cfg.node_types))).select(
        F.col("node_id").alias("target"), "node_type", "raw_id", "source"
    )
    user_k1 = user_budget(edges, cfg)
    cfg = dataclasses.replace(cfg, user_k1=user_k1)
    drawn = draw(edges, cfg)
    room = cfg.max_tokens - 1  # positions 1 .. max_tokens - 1 hold neighbours

    budget = F.when(F.col("src_type") == "user", F.lit(user_k1)).otherwise(F.lit(cfg.k1))
    hop1 = drawn.where(F.col("rank") <= budget).join(
        targets.select(F.col("target").alias("src")), "src", "left_semi"
    )
    hop1 = hop1.withColumn(
        "pos", F.row_number().over(Window.partitionBy("src").orderBy("rank", "edge_code", "dst"))
    ).where(F.col("pos") <= room)
    hop1 = hop1.withColumn("num_hop1", F.count(F.lit(1)).over(Window.partitionBy("src")).cast("int"))
    hop1 = hop1.withColumnRenamed("src", "target")

    if cfg.k2 > 0:
        under = hop2_lists(drawn, cfg)
        hop2 = hop1.select(
            "target", F.col("dst").alias("parent"), F.col("pos").alias("parent_pos"), "num_hop1"
        ).join(under.withColumnRenamed("src", "parent"), "parent")
        hop2 = hop2.where(F.col("dst") != F.col("target"))
        hop2 = hop2.withColumn(
            "rank",
            F.row_number().over(Window.partitionBy("target", "parent_pos").orderBy(F.desc("key"), "dst")),
        ).where(F.col("rank") <= cfg.k2)
        order = Window.partitionBy("target").orderBy("rank", "parent_pos")
        hop2 = hop2.withColumn("pos", F.col("num_hop1") + F.row_number().over(order)).where(
            F.col("pos") <= room
        )
        hop2_tokens = hop2.select(
            "target",
            "pos",
            _token("dst", "node_type", "edge_code", 2, "parent_pos", "recency", "weight", "is_deep").alias(
                "token"
            ),
        )
    else:
        hop2_tokens = None

    tokens = hop1.select(
        "target",
        "pos",
        _token("dst", "node_type", "edge_code", 1, 0, "recency", "weight", "is_deep").alias("token"),
    )
    if hop2_tokens is not None:
        tokens = tokens.unionByName(hop2_tokens)
    neighbours = tokens.groupBy("target").agg(
        F.array_sort(F.collect_list(F.struct("pos", "token"))).alias("tokens"),
        F.count_if(F.col("token.hop") == 1).cast("int").alias("num_hop1"),
    )

    rows = targets.join(neighbours, "target", "left")
    target_token = _token(
        F.col("target"),
        _code(F.col("node_type"), NODE_TYPES, "node type"),
        EDGE_TYPES["self"],
        0,
        -1,
        0,
        0.0,
        False,
    )
    real = F.when(F.col("tokens").isNull(), F.array(target_token)).otherwise(
        F.concat(F.array(target_token), F.transform("tokens", lambda t: t["token"]))
    )
    padded = F.concat(real, F.array_repeat(_token(*PAD_TOKEN), F.lit(cfg.max_tokens) - F.size(real)))
    rows = rows.select(
        F.col("target").alias("node_id"),
        "node_type",
        "raw_id",
        "source",
        F.size(real).cast("int").alias("num_tokens"),
        F.coalesce(F.col("num_hop1"), F.lit(0)).cast("int").alias("num_hop1"),
        padded.alias("tokens"),
    )
    return rows.select(
        "node_id",
        "node_type",
        "raw_id",
        "source",
        "num_tokens",
        "num_hop1",
        *[_field(F.col("tokens"), f).alias(f"token_{f}") for f in TOKEN_FIELDS],
        F.lit(cfg.seed).cast("long").alias("sample_seed"),
    )


def _field(tokens: Column, name: str) -> Column:
    """The array of one field of an array of token structs."""
    return F.transform(tokens, lambda token: token[name])


# --- the job -------------------------------------------------------------------------------------------------------


def sample_day(spark: SparkSession, cfg: SampleConfig) -> dict[str, dict[str, float]]:
    """Read the day's graph, sample, write the day's partition; return per target type: rows, mean tokens, cold."""
    log = StageLog("sample_neighbourhoods", {"ds": cfg.ds.isoformat(), "k1": cfg.k1, "k2": cfg.k2})
    nodes = read_table(spark, NODES, cfg.warehouse).where(cfg.day_slice)
    edges = read_table(spark, EDGES, cfg.warehouse).where(cfg.day_slice)
    nodes_in = {r[0]: int(r[1]) for r in nodes.groupBy("node_type").count().collect()}
    if not nodes_in:
        raise HirError(f"no nodes for {cfg.ds} in {cfg.warehouse}: run `hir build-graph --ds {cfg.ds}` first")
    sample = sample_neighbourhoods(nodes, edges, cfg).withColumn("ds", F.lit(cfg.ds))
    version = write_table(sample, NEIGHBOURHOODS, cfg.warehouse, cfg.day_slice)
    written = read_table(spark, NEIGHBOURHOODS, cfg.warehouse).where(cfg.day_slice)
    stats = {
        r["node_type"]: {
            "rows": int(r["rows"]),
            "mean_tokens": round(float(r["mean_tokens"]), 2),
            "target_only": int(r["target_only"]),
            "with_deep": int(r["with_deep"]),
        }
        for r in written.groupBy("node_type")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.avg("num_tokens").alias("mean_tokens"),
            F.count_if(F.col("num_tokens") == 1).alias("target_only"),
            F.count_if(F.exists("token_is_deep", lambda d: d)).alias("with_deep"),
        )
        .collect()
    }
    log.counts.update(nodes_in=nodes_in, rows_out={t: s["rows"] for t, s in stats.items()}, version=version)
    log.emit()
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    spark = get_spark("hir-sample-neighbourhoods", places={"--warehouse": cfg.warehouse})
    stats = sample_day(spark, cfg)
    for node_type, s in sorted(stats.items()):
        print(
            f"neighbourhoods {cfg.ds} {node_type}: {s['rows']} rows, {s['mean_tokens']} tokens on average, "
            f"{s['target_only']} with the target only, {s['with_deep']} with a deep-funnel token"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
