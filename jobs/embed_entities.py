"""Run the trained encoder over a day's neighbourhoods: the daily `embeddings`, `bom_tokens` and `bom_vocab`.

    hir embed --ds 2017-12-03 --warehouse warehouse/taobao
    spark-submit --conf spark.executor.resource.gpu.amount=1 --conf spark.task.resource.gpu.amount=1 \
        jobs/embed_entities.py --ds 2017-12-03 --warehouse warehouse/taobao --model warehouse/taobao/models/<version>

The model is loaded once per Python worker (udfs/embed.py) and runs on the task's GPU when Spark assigned one,
on any CUDA device otherwise, else on CPU. Every row of `neighbourhoods` for `ds` gets exactly one embedding and
its Bag-of-Meaning tokens; a rerun replaces the day. Table properties and commit metadata record the model
version and the Delta versions read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from hir_model import storage
from hir_model.checkpoint import ModelPath, is_complete, list_versions, model_path, published_at
from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, parse_place, run_job
from jobs.common.delta import read_table, table_exists, table_path, table_snapshot, table_version, write_table
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.common.stage import StageLog
from jobs.train.continuity import aligned_day, previous_paths
from schemas.tables import BOM_TOKENS, BOM_VOCAB, EMBEDDINGS, ENTITIES, ENTITY_CONTENT, NEIGHBOURHOODS, NODES
from udfs.embed import OUTPUT_SCHEMA, EmbedSpec, embed_partitions

# Hysteresis margin in level temperatures. On the 7-day synthetic warm backfill with anchored codebooks
# (bench/sticky_codes.py, README Results "Day to day"), margin 1 kept the level-0 token of 0.82-0.88 of the
# unchanged items on days 4, 5 and 7; margin 2 kept 0.95-1.00 on every day as a one-day step, 0.92-1.00 when
# the backfill was rerun at it, at 1.05-1.15 times margin 0's reconstruction error.
DEFAULT_STICKINESS = 2.0


@dataclass(frozen=True)
class EmbedConfig:
    ds: dt.date
    warehouse: str = "warehouse"
    model: str | None = None
    batch_size: int = 256
    arrow_batch_size: int = 2048
    device: str = "auto"
    precision: str = "auto"
    top_n: int = 3
    temperature: float | None = None  # None: the quantiser's calibrated per-level temperatures
    label_terms: int = 3
    stickiness: float = DEFAULT_STICKINESS
    allow_collapsed: bool = False


@dataclass(frozen=True)
class EmbedReport:
    entities: int
    model_version: str
    versions: dict[str, int]


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir embed", description=__doc__.split("\n\n")[0])
    p.add_argument("--ds", type=parse_ds, required=True, help="Day to embed (YYYY-MM-DD).")
    add_warehouse_flag(p)
    p.add_argument(
        "--model",
        type=parse_place,
        help="Model version directory (a path, s3a:// or hdfs://). Default: the newest one under <warehouse>/models, which is what the "
        "train stage of the same pipeline run just wrote.",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=256,
        help="Rows per forward pass: 256 x 64 tokens keeps CPU attention in cache-friendly sizes; raise it on GPU.",
    )
    p.add_argument(
        "--arrow-batch-size",
        type=int,
        default=2048,
        help="Rows per Arrow batch handed to the Python worker: several forward passes per transfer amortise "
        "the serialisation cost (see bench/embed_throughput.py).",
    )
    p.add_argument(
        "--device", default="auto", help="auto (task GPU, else CUDA, else CPU), cpu, cuda or cuda:N."
    )
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="auto = bf16 autocast on CUDA (embeddings are re-normalised in fp32), fp32 on CPU where bf16 is slow.",
    )
    p.add_argument(
        "--top-n", type=int, default=3, help="Tokens per level in a bag: the runner-ups carry meaning."
    )
    p.add_argument(
        "--temperature",
        type=parse_temperature,
        default=None,
        help="Softmax temperature of the bags' soft assignment. Default auto: each level's temperature calibrated "
        "when the quantiser was fitted (median gap between nearest and second-nearest code), so a bag's weights "
        "carry how firmly the entity sits in each token; a number fixes one temperature for every level.",
    )
    p.add_argument(
        "--stickiness",
        type=float,
        default=DEFAULT_STICKINESS,
        help="Hysteresis of the hard codes, in temperatures of each level: an entity keeps the code it had on the "
        "day the model's token ids were aligned to while that code's squared distance exceeds the nearest one's by "
        "at most this many temperatures (1: the median gap between an entity's nearest and second-nearest code), "
        "so entities near a boundary do not flip tokens as the centroids move; 0 always takes the nearest code. "
        f"Default {DEFAULT_STICKINESS:g}.",
    )
    p.add_argument(
        "--allow-collapsed",
        action="store_true",
        help="Embed with a model whose training collapsed (diagnosis only).",
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> EmbedConfig:
    a = build_parser().parse_args(argv)
    fixed_temperature = a.temperature is not None
    if (
        a.batch_size <= 0
        or a.arrow_batch_size <= 0
        or a.top_n <= 0
        or (fixed_temperature and a.temperature <= 0)
    ):
        raise HirError("--batch-size, --arrow-batch-size, --top-n and --temperature must be positive")
    if not a.stickiness >= 0:  # also refuses nan
        raise HirError(f"--stickiness must be 0 or more, got {a.stickiness}")
    return EmbedConfig(
        ds=a.ds,
        warehouse=a.warehouse,
        model=a.model,
        batch_size=a.batch_size,
        arrow_batch_size=a.arrow_batch_size,
        device=a.device,
        precision=a.precision,
        top_n=a.top_n,
        temperature=a.temperature,
        stickiness=a.stickiness,
        allow_collapsed=a.allow_collapsed,
    )


def parse_temperature(value: str) -> float | None:
    if value == "auto":
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperature must be auto or a number, got '{value}'") from None


def resolve_model_dir(warehouse: str, model: str | None) -> ModelPath:
    """The model version directory to use (a local Path or a remote URI); one-line error when there is none."""
    if model:
        path = model_path(model)
        if not is_complete(path):
            raise HirError(f"model directory {path} has no weights.pt: not a trained model version")
        return path
    root = storage.join(warehouse, "models")
    versions = sorted(list_versions(root), key=lambda p: (published_at(p), storage.name(p)))
    if not versions:
        raise HirError(f"no trained model under {root}: run `hir train` first or pass --model")
    return versions[-1]


def check_not_collapsed(model_dir: ModelPath, allow: bool) -> None:
    """Refuse a model whose training summary says it collapsed: its embeddings carry no information."""
    from hir_model.checkpoint import read_summary

    if read_summary(model_dir).get("collapsed") and not allow:
        raise HirError(
            f"model {storage.name(model_dir)} collapsed in training: retrain, or pass --allow-collapsed to embed "
            "anyway"
        )


def bom_tokens(embedded: DataFrame, levels: int, top_n: int) -> DataFrame:
    """One row per (entity, level, rank). Token 'L<level>:<c0>.<c1>...<c_level>' names a code path, so a level-l
    token lives under exactly one level-(l-1) token; weights sum to 1 per entity and level."""
    hard = F.transform(F.sequence(F.lit(0), F.lit(levels - 1)), lambda i: F.col("bom_codes")[i * top_n])
    base = embedded.select(
        "node_type",
        "node_id",
        "raw_id",
        "model_version",
        hard.alias("hard"),
        F.posexplode(F.arrays_zip("bom_codes", "bom_weights")).alias("pos", "pair"),
    )
    level = F.floor(F.col("pos") / top_n).cast("int")
    prefix = F.transform(F.slice("hard", 1, level), lambda c: c.cast("string"))
    token = F.concat(
        F.lit("L"),
        level.cast("string"),
        F.lit(":"),
        F.array_join(F.concat(prefix, F.array(F.col("pair.bom_codes").cast("string"))), "."),
    )
    return base.select(
        F.col("node_type").alias("entity_type"),
        "node_id",
        "raw_id",
        level.alias("bom_level"),
        token.alias("token"),
        F.col("pair.bom_weights").alias("weight"),
        ((F.col("pos") % top_n) + 1).cast("int").alias("rank"),
        F.array_join("hard", ".").alias("path"),
        "model_version",
    )


def parent_token(token: Column, level: Column) -> Column:
    """'L2:3.17.5' -> 'L1:3.17'; null at level 0."""
    body = F.regexp_extract(token, r"^L[0-9]+:(.*)\.[0-9]+$", 1)
    return F.when(level > 0, F.concat(F.lit("L"), (level - 1).cast("string"), F.lit(":"), body))


def descriptors(nodes: DataFrame, entities: DataFrame, neighbourhoods: DataFrame) -> DataFrame:
    """(node_id, term): what an entity is about in words. Items: leaf taxonomy and brand; advertisers and
    categories: their own name; users: the terms of the items in their hop-1 neighbourhood."""
    from jobs.enrich_entities import words

    items = nodes.where("node_type = 'item'").join(
        entities.select(
            "source", F.col("entity_id").alias("raw_id"), "category_id", "category_code", "brand"
        ),
        ["source", "raw_id"],
    )
    leaf = F.coalesce(
        F.element_at(F.split(words(F.col("category_code")), " "), -1),
        F.concat(F.lit("category "), F.col("category_id")),
    )
    item_terms = items.select(
        "node_id",
        F.explode(
            F.filter(
                F.array(leaf, F.when(F.col("brand").isNotNull(), F.concat(F.lit("brand "), F.col("brand")))),
                lambda t: t.isNotNull(),
            )
        ).alias("term"),
    )
    named = nodes.where("node_type IN ('advertiser', 'category')").select(
        "node_id",
        F.when(F.col("node_type") == "advertiser", F.concat(F.lit("brand "), F.col("raw_id")))
        .otherwise(words(F.col("raw_id")))
        .alias("term"),
    )
    user_items = (
        neighbourhoods.where("node_type = 'user'")
        .select("node_id", F.explode(F.arrays_zip("token_node_id", "token_hop")).alias("t"))
        .where("t.token_hop = 1")
        .select("node_id", F.col("t.token_node_id").alias("item_id"))
    )
    user_terms = user_items.join(item_terms.withColumnRenamed("node_id", "item_id"), "item_id").select(
        "node_id", "term"
    )
    return item_terms.unionByName(named).unionByName(user_terms).distinct()


def bom_vocab(tokens: DataFrame, terms: DataFrame, label_terms: int) -> DataFrame:
    """Every token of the day with its parent, its member count (entities whose exact path passes through it)
    and a label made of the terms most shared by those members."""
    members = tokens.where("rank = 1").select("token", "node_id")
    sizes = members.groupBy("token").agg(F.count(F.lit(1)).cast("long").alias("size"))
    counts = (
        members.join(terms, "node_id").groupBy("token", "term").agg(F.countDistinct("node_id").alias("n"))
    )
    best = Window.partitionBy("token").orderBy(F.desc("n"), "term")
    labels = (
        counts.withColumn("r", F.row_number().over(best))
        .where(F.col("r") <= label_terms)
        .groupBy("token")
        .agg(
            F.array_join(
                F.transform(F.array_sort(F.collect_list(F.struct("r", "term"))), lambda x: x["term"]), " | "
            ).alias("label")
        )
    )
    vocab = tokens.select("token", "bom_level", "model_version").distinct()
    return (
        vocab.join(sizes, "token", "left")
        .join(labels, "token", "left")
        .select(
            "token",
            "bom_level",
            parent_token(F.col("token"), F.col("bom_level")).alias("parent_token"),
            F.coalesce("size", F.lit(0)).cast("long").alias("size"),
            F.coalesce("label", F.lit("unlabelled")).alias("label"),
            "model_version",
        )
    )


def previous_vocab(spark: SparkSession, warehouse: str, ds: dt.date) -> DataFrame | None:
    """The vocabulary of the latest day before `ds` (its retired rows left out), None when there is none."""
    if not table_exists(spark, BOM_VOCAB, warehouse):
        return None
    earlier = read_table(spark, BOM_VOCAB, warehouse).where(F.col("ds") < F.lit(ds))
    last = earlier.agg(F.max("ds")).first()[0]
    if last is None:
        return None
    for column in ("status", "first_ds"):  # a table written before these columns existed
        if column not in earlier.columns:
            earlier = earlier.withColumn(column, F.lit(None).cast("string" if column == "status" else "date"))
    return earlier.where((F.col("ds") == F.lit(last)) & F.coalesce(F.col("status") != "retired", F.lit(True)))


def vocab_continuity(vocab: DataFrame, previous: DataFrame | None, ds: dt.date) -> DataFrame:
    """Mark each token of the day new or continued against the previous day's vocabulary, carry its first day,
    and add a size-0 'retired' row (with the previous day's parent and label) for every token the day lost.
    Token ids are path strings, so this is a join on the id: jobs.train.continuity keeps the ids stable."""
    if previous is None:
        return vocab.withColumn("status", F.lit("new")).withColumn("first_ds", F.lit(ds))
    before = previous.select(
        "token",
        F.col("bom_level").alias("prev_level"),
        F.col("parent_token").alias("prev_parent"),
        F.col("label").alias("prev_label"),
        F.coalesce("first_ds", "ds").alias("prev_first_ds"),
    )
    today = vocab.join(before, "token", "left").select(
        *vocab.columns,
        F.when(F.col("prev_level").isNull(), F.lit("new")).otherwise(F.lit("continued")).alias("status"),
        F.coalesce("prev_first_ds", F.lit(ds)).alias("first_ds"),
    )
    model_version = vocab.select("model_version").limit(1)
    retired = (
        before.join(vocab.select("token"), "token", "left_anti")
        .crossJoin(model_version)
        .select(
            "token",
            F.col("prev_level").alias("bom_level"),
            F.col("prev_parent").alias("parent_token"),
            F.lit(0).cast("long").alias("size"),
            F.col("prev_label").alias("label"),
            "model_version",
            F.lit("retired").alias("status"),
            F.col("prev_first_ds").alias("first_ds"),
        )
    )
    return today.unionByName(retired)


def served_content(
    spark: SparkSession, warehouse: str, model_dir: ModelPath
) -> tuple[tuple[str, ...], int | None]:
    """The entity_content files the model is served with: none for a model without content; else the version
    its training pinned (lineage) when it was trained on this warehouse, the latest otherwise, with the same
    deletion-vector check as training. Refused in one line, before Spark runs the model, when the table is
    missing or its vectors are not the model's content_dim."""
    from hir_model.checkpoint import read_config, read_lineage

    config, _ = read_config(model_dir)
    if not config.content_enabled:
        return (), None
    if not table_exists(spark, ENTITY_CONTENT, warehouse):
        raise HirError(
            f"model {storage.name(model_dir)} was trained with content vectors but {warehouse} has no "
            "entity_content: "
            "run `hir enrich` for the day first"
        )
    pinned = (read_lineage(model_dir).get("inputs") or {}).get("entity_content") or {}
    here = pinned.get("path") == table_path(warehouse, ENTITY_CONTENT)
    snapshot = table_snapshot(spark, ENTITY_CONTENT, warehouse, pinned.get("version") if here else None, None)
    dims = {
        r[0]
        for r in read_table(spark, ENTITY_CONTENT, warehouse, snapshot.version)
        .select(F.size("vector"))
        .distinct()
        .collect()
    }
    if dims - {config.content_dim}:
        raise HirError(
            f"entity_content version {snapshot.version} holds {sorted(dims)}-dimensional vectors, model "
            f"{storage.name(model_dir)} was trained on {config.content_dim}: embed with the encoder it was trained on"
        )
    return snapshot.files, snapshot.version


def check_row_length(rows: DataFrame, model_dir: ModelPath) -> None:
    """Refuse, before Spark runs the model, neighbourhood rows longer than the model's max_tokens."""
    from hir_model.checkpoint import read_config

    max_tokens = read_config(model_dir)[0].max_tokens
    longest = rows.select(F.max(F.size("token_node_id"))).first()[0]
    if longest is not None and longest > max_tokens:
        raise HirError(
            f"neighbourhood rows hold {longest} tokens, model {storage.name(model_dir)} takes at most {max_tokens}: "
            f"sample with --max-tokens {max_tokens} or retrain"
        )


def embed(spark: SparkSession, cfg: EmbedConfig) -> EmbedReport:
    """Embed every neighbourhood row of `ds` and write the three daily tables."""
    from hir_model.checkpoint import load_model
    from jobs.enrich_entities import latest_entities

    log = StageLog("embed", {"ds": str(cfg.ds)})
    model_dir = resolve_model_dir(cfg.warehouse, cfg.model)
    check_not_collapsed(model_dir, cfg.allow_collapsed)
    n_version = table_version(spark, NEIGHBOURHOODS, cfg.warehouse)
    rows = read_table(spark, NEIGHBOURHOODS, cfg.warehouse, version=n_version).where(
        F.col("ds") == F.lit(cfg.ds)
    )
    # What the model needs is checked from its config before its weights are loaded or Spark runs it.
    check_row_length(rows, model_dir)
    content_files, content_version = served_content(spark, cfg.warehouse, model_dir)
    model = load_model(model_dir)
    if model.quantiser is None:
        raise HirError(f"model {model_dir} has no quantiser: retrain with the current `hir train`")
    levels = model.quantiser.levels
    spec = EmbedSpec(
        model_dir=storage.normalise(
            model_dir
        ),  # workers load it with the driver's storage settings (EmbedSpec)
        content_files=content_files,
        batch_size=cfg.batch_size,
        device=cfg.device,
        precision=cfg.precision,
        top_n=cfg.top_n,
        temperature=cfg.temperature,
        stickiness=cfg.stickiness,
    )
    # Hysteresis needs yesterday's path of each entity, in the ids the model's codes were aligned to.
    aligned = aligned_day(model_dir) if cfg.stickiness > 0 else None
    paths = previous_paths(spark, cfg.warehouse, aligned) if aligned is not None else None
    served = rows.join(paths, "node_id", "left") if paths is not None else rows
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(cfg.arrow_batch_size))
    embedded = (
        served.mapInPandas(embed_partitions(spec), OUTPUT_SCHEMA)
        .withColumn("model_version", F.lit(model.version))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        n_rows = rows.count()
        n_embedded = embedded.count()
        if n_rows == 0:
            raise HirError(f"no neighbourhoods for ds {cfg.ds}: run sample-neighbourhoods first")
        if n_embedded != n_rows:
            raise HirError(
                f"embedded {n_embedded} of {n_rows} neighbourhood rows: refusing to write a partial day"
            )
        lineage = json.dumps(
            {
                "model_version": model.version,
                "model_dir": str(model_dir),
                "neighbourhoods_version": n_version,
                "entity_content_version": content_version,
                "sticky_to": str(aligned) if paths is not None else None,
            }
        )
        day = f"ds = DATE'{cfg.ds}'"
        with_day = lambda df: df.withColumn("ds", F.lit(cfg.ds))  # noqa: E731
        versions = {
            "embeddings": write_table(
                with_day(
                    embedded.select(
                        F.col("node_type").alias("entity_type"),
                        "node_id",
                        "raw_id",
                        "vector",
                        "model_version",
                    )
                ),
                EMBEDDINGS,
                cfg.warehouse,
                day,
                user_metadata=lineage,
            )
        }
        tokens = bom_tokens(embedded, levels, cfg.top_n).persist(StorageLevel.MEMORY_AND_DISK)
        versions["bom_tokens"] = write_table(
            with_day(tokens), BOM_TOKENS, cfg.warehouse, day, user_metadata=lineage
        )
        nodes = read_table(spark, NODES, cfg.warehouse).where(F.col("ds") == F.lit(cfg.ds))
        entities = latest_entities(read_table(spark, ENTITIES, cfg.warehouse), cfg.ds)
        terms = descriptors(nodes, entities, rows)
        vocab = vocab_continuity(
            bom_vocab(tokens, terms, cfg.label_terms), previous_vocab(spark, cfg.warehouse, cfg.ds), cfg.ds
        )
        versions["bom_vocab"] = write_table(
            with_day(vocab), BOM_VOCAB, cfg.warehouse, day, user_metadata=lineage
        )
        tokens.unpersist()
    finally:
        embedded.unpersist()
    log.counts.update(rows_in=n_rows, rows_out=n_embedded, model_version=model.version)
    log.emit()
    return EmbedReport(entities=n_embedded, model_version=model.version, versions=versions)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    report = embed(get_spark("hir-embed"), cfg)
    print(
        f"embed {cfg.ds}: {report.entities} entities with model {report.model_version}; versions {report.versions}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
