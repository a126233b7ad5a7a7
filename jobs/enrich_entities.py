"""Embed every entity's text (taxonomy, brand, price band, title) with a language model into `entity_content`.

    hir enrich --ds 2017-12-03 --warehouse warehouse/taobao
    spark-submit jobs/enrich_entities.py --ds 2019-10-01 --warehouse warehouse/rees46 --encoder minilm

Reads the day's `nodes` (items, advertisers, categories) and the latest `entities` attributes up to `ds`, builds
one text per node, and embeds only nodes whose text (or encoder) changed since the last run: the table is MERGEd
on node_id, keyed by a sha256 of the text, so a second run over unchanged entities embeds nothing. Users get no
text: their content is what they interact with, which the graph already carries.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from hir_model.content import encoder_name, validate_spec
from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, run_job
from jobs.common.delta import merge_table, read_table, table_exists
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.common.stage import StageLog
from schemas.tables import ENTITIES, ENTITY_CONTENT, NODES
from udfs.content import embed_text

CONTENT_NODE_TYPES = ("item", "advertiser", "category")


@dataclass(frozen=True)
class EnrichConfig:
    ds: dt.date
    warehouse: str = "warehouse"
    encoder: str = "minilm"
    arrow_batch_size: int = 1024
    node_types: tuple[str, ...] = CONTENT_NODE_TYPES


@dataclass(frozen=True)
class EnrichReport:
    nodes: int
    embedded: int
    unchanged: int
    version: int | None
    texts: int = 0  # distinct texts the encoder ran on (nodes sharing a text share its vector)


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir enrich", description=__doc__.split("\n\n")[0])
    p.add_argument("--ds", type=parse_ds, required=True, help="Day whose nodes get content (YYYY-MM-DD).")
    add_warehouse_flag(p)
    p.add_argument(
        "--encoder",
        default="minilm",
        help="Content encoder: minilm (all-MiniLM-L6-v2, ships with its weights, 384-d, the accuracy/speed sweet "
        "spot of small sentence encoders), hashing[:DIM] (no model, for tests), or package.module:Class.",
    )
    p.add_argument(
        "--arrow-batch-size",
        type=int,
        default=1024,
        help="Rows per Arrow batch sent to the UDF: big enough to keep the encoder busy, small enough that a "
        "batch of token tensors stays in the tens of MB.",
    )
    p.add_argument(
        "--node-types",
        default=",".join(CONTENT_NODE_TYPES),
        help="Comma-separated node types to embed; users have no text of their own.",
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> EnrichConfig:
    args = build_parser().parse_args(argv)
    types = tuple(t.strip() for t in args.node_types.split(",") if t.strip())
    unknown = [t for t in types if t not in CONTENT_NODE_TYPES]
    if unknown or not types:
        raise HirError(
            f"--node-types: '{(unknown or [''])[0]}' has no text (choose from {CONTENT_NODE_TYPES})"
        )
    if args.arrow_batch_size <= 0:
        raise HirError("--arrow-batch-size must be positive")
    try:
        validate_spec(args.encoder)
    except ValueError as exc:
        raise HirError(str(exc)) from None
    return EnrichConfig(args.ds, args.warehouse, args.encoder, args.arrow_batch_size, types)


def words(column: Column) -> Column:
    """'appliances.kitchen.mixer' -> 'appliances kitchen mixer'."""
    return F.trim(F.regexp_replace(column, r"[._/]+", " "))


def price_band(price: Column) -> Column:
    # Log-spaced bands: a language model knows 'budget' vs 'premium', not 33.20 vs 35.79.
    return (
        F.when(price.isNull(), None)
        .when(price < 10, "budget price")
        .when(price < 50, "low price")
        .when(price < 200, "mid price")
        .when(price < 1000, "high price")
        .otherwise("premium price")
    )


def latest_entities(entities: DataFrame, ds: dt.date) -> DataFrame:
    """Each item's most recent attribute row on or before `ds` (never a later one)."""
    recent = Window.partitionBy("source", "entity_id").orderBy(F.desc("ds"))
    return (
        entities.where(F.col("ds") <= F.lit(ds))
        .withColumn("_rank", F.row_number().over(recent))
        .where("_rank = 1")
        .drop("_rank")
    )


def build_texts(nodes: DataFrame, entities: DataFrame) -> DataFrame:
    """One text per item, advertiser and category node: (node_id, node_type, raw_id, text)."""
    items = nodes.where("node_type = 'item'").join(
        entities.select(
            "source",
            F.col("entity_id").alias("raw_id"),
            "category_id",
            "category_code",
            "brand",
            "price",
            "title",
        ),
        ["source", "raw_id"],
        "left",
    )
    taxonomy = F.coalesce(words(F.col("category_code")), F.concat(F.lit("category "), F.col("category_id")))
    item_text = F.concat_ws(
        ". ",
        taxonomy,
        F.when(F.col("brand").isNotNull(), F.concat(F.lit("brand "), F.col("brand"))),
        price_band(F.col("price")),
        F.col("title"),
    )
    items = items.select("node_id", "node_type", "raw_id", item_text.alias("text"))

    advertisers = nodes.where("node_type = 'advertiser'").select(
        "node_id", "node_type", "raw_id", F.concat(F.lit("brand "), F.col("raw_id")).alias("text")
    )

    # A leaf category (raw id = category_id) reads as its items' most common taxonomy code; a parent category's
    # raw id is a taxonomy prefix and reads as its words; an id known by nothing else stays 'category <id>'.
    code_counts = (
        entities.where(F.col("category_code").isNotNull())
        .groupBy("source", F.col("category_id").alias("raw_id"), "category_code")
        .count()
    )
    best = Window.partitionBy("source", "raw_id").orderBy(F.desc("count"), "category_code")
    leaf_code = code_counts.withColumn("_r", F.row_number().over(best)).where("_r = 1").drop("_r", "count")
    categories = nodes.where("node_type = 'category'").join(leaf_code, ["source", "raw_id"], "left")
    category_text = F.coalesce(
        words(F.col("category_code")),
        F.when(F.col("raw_id").rlike("[A-Za-z]"), words(F.col("raw_id"))),
        F.concat(F.lit("category "), F.col("raw_id")),
    )
    categories = categories.select("node_id", "node_type", "raw_id", category_text.alias("text"))
    return items.unionByName(advertisers).unionByName(categories)


def enrich(spark: SparkSession, cfg: EnrichConfig) -> EnrichReport:
    log = StageLog("enrich", {"ds": str(cfg.ds), "encoder": cfg.encoder})
    nodes = read_table(spark, NODES, cfg.warehouse).where(F.col("ds") == F.lit(cfg.ds))
    nodes = nodes.where(F.col("node_type").isin(list(cfg.node_types)))
    entities = latest_entities(read_table(spark, ENTITIES, cfg.warehouse), cfg.ds)
    texts = build_texts(nodes, entities).withColumn("text_hash", F.sha2(F.col("text"), 256)).persist()
    try:
        total = texts.count()
        if total == 0:
            raise HirError(f"no {'/'.join(cfg.node_types)} nodes for ds {cfg.ds}: run build-graph first")
        name = encoder_name(cfg.encoder)
        todo = texts
        if table_exists(spark, ENTITY_CONTENT, cfg.warehouse):
            current = (
                read_table(spark, ENTITY_CONTENT, cfg.warehouse)
                .where(F.col("encoder") == name)
                .select("node_id", "text_hash")
            )
            todo = texts.join(current, ["node_id", "text_hash"], "left_anti")
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(cfg.arrow_batch_size))
        # The language model runs once per distinct text, not once per node: catalogs repeat texts (Taobao's items
        # read only as their category, 30,673 nodes for a few thousand texts), and a text's vector is the same
        # whichever node carries it.
        vectors = (
            todo.select("text_hash", "text")
            .dropDuplicates(["text_hash"])
            .select("text_hash", embed_text(F.col("text"), cfg.encoder).alias("vector"))
            .persist()
        )
        embedded = (
            todo.join(vectors, "text_hash")
            .select(
                "node_id",
                "node_type",
                "raw_id",
                "text",
                "text_hash",
                "vector",
                F.lit(name).alias("encoder"),
                F.lit(cfg.ds).alias("updated_ds"),
            )
            .persist()
        )
        try:
            n_texts = vectors.count()
            n_embedded = embedded.count()
            version = (
                merge_table(embedded, ENTITY_CONTENT, cfg.warehouse, ("node_id",)) if n_embedded else None
            )
        finally:
            embedded.unpersist()
            vectors.unpersist()
    finally:
        texts.unpersist()
    report = EnrichReport(
        nodes=total, embedded=n_embedded, unchanged=total - n_embedded, version=version, texts=n_texts
    )
    log.counts.update(rows_in=total, rows_out=n_embedded, unchanged=report.unchanged, texts_encoded=n_texts)
    log.emit()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    report = enrich(get_spark("hir-enrich", places={"--warehouse": cfg.warehouse}), cfg)
    print(
        f"enrich {cfg.ds}: {report.nodes} nodes, {report.embedded} embedded ({report.texts} distinct texts), "
        f"{report.unchanged} unchanged"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
