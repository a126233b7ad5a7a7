"""Ingest raw event logs into the canonical `events`, `entities` and `ingest_rejects` tables.

    spark-submit jobs/ingest_events.py --source taobao --input ../shared/data/taobao_userbehavior/UserBehavior_user_complete.csv --warehouse warehouse
    hir ingest --source rees46 --input 2019-Oct.csv --warehouse warehouse
    hir ingest --source generic --mapping conf/sources/generic_example.toml --input events.parquet
    hir ingest --source synthetic --users 2000 --items 5000 --events 200000 --seed 7

Every record read ends up in `events`, in `ingest_rejects` with a reason, or is counted as an exact duplicate;
the job prints that reconciliation. Above --max-reject-fraction nothing is written. A rerun replaces this
source's days (and this input's rejects) and never touches another source's rows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, run_job
from jobs.common.delta import read_table, sql_in, write_table
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.common.stage import StageLog
from jobs.sources import generic, rees46, synthetic, taobao
from jobs.sources.canonical import SourceRules, canonicalize
from schemas.tables import ENTITIES, EVENTS, INGEST_REJECTS, SYNTHETIC_TRUTH

SOURCES = ("taobao", "rees46", "generic", "synthetic")


@dataclass(frozen=True)
class IngestConfig:
    source: str
    inputs: tuple[str, ...] = ()
    warehouse: str = "warehouse"
    ds: dt.date | None = None
    max_reject_fraction: float = 0.05
    mapping: str | None = None
    run_id: str | None = None
    synthetic: synthetic.SyntheticSpec | None = None


@dataclass(frozen=True)
class IngestReport:
    source: str
    read: int
    events: int
    rejects: int
    duplicates: int
    days: tuple[str, ...]
    entities: int
    reject_reasons: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    @property
    def reconciles(self) -> bool:
        return self.read == self.events + self.rejects + self.duplicates

    def line(self) -> str:
        return (
            f"{self.source}: read {self.read} = events {self.events} + rejects {self.rejects} + duplicates "
            f"{self.duplicates} ({'reconciled' if self.reconciles else 'DOES NOT RECONCILE'}); "
            f"{len(self.days)} day(s), {self.entities} entity rows"
        )


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir ingest", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--source", required=True, choices=SOURCES, help="Input adapter; decides parsing and time zone."
    )
    p.add_argument(
        "--input",
        nargs="+",
        default=[],
        help="Files or folders (local or URI). Pass every file of a source in one run: duplicates are removed "
        "across them and the run replaces the source's days.",
    )
    add_warehouse_flag(p)
    p.add_argument(
        "--ds",
        type=parse_ds,
        help="Expected day (YYYY-MM-DD) for a daily run: events of other days are rejected. Default: ingest "
        "every day in the input (backfill).",
    )
    p.add_argument(
        "--max-reject-fraction",
        type=float,
        default=0.05,
        help="Fail without writing when more than this share of records is rejected. 5%% tolerates real-world "
        "dirt (REES46 loses 1 line in 17k) but stops a wrong --source or a broken file.",
    )
    p.add_argument("--mapping", help="TOML column mapping for --source generic (see conf/sources/).")
    p.add_argument(
        "--run-id",
        help="Id stored with the rejects. Default: derived from source and inputs, so a "
        "rerun of the same ingest writes identical tables.",
    )
    g = p.add_argument_group("synthetic source")
    g.add_argument(
        "--users", type=int, default=2000, help="Users to simulate (default sized for a 2-core demo)."
    )
    g.add_argument("--items", type=int, default=5000, help="Items to simulate.")
    g.add_argument("--events", type=int, default=200_000, help="Approximate number of events to generate.")
    g.add_argument("--seed", type=int, default=7, help="Generator seed; same seed, same events.")
    g.add_argument("--parents", type=int, default=8, help="Planted parent interest clusters.")
    g.add_argument("--children", type=int, default=4, help="Fine clusters per parent cluster.")
    g.add_argument("--start", type=parse_ds, default=dt.date(2026, 1, 1), help="First simulated day.")
    g.add_argument("--days", type=int, default=7, help="Simulated days.")
    return p


def config_from_args(argv: Sequence[str] | None) -> IngestConfig:
    args = build_parser().parse_args(argv)
    if not 0 <= args.max_reject_fraction <= 1:
        raise HirError("--max-reject-fraction must be between 0 and 1")
    spec = None
    if args.source == "synthetic":
        if args.input:
            raise HirError("--source synthetic generates its events: drop --input")
        if min(args.users, args.items, args.events, args.parents, args.children, args.days) <= 0:
            raise HirError("--users, --items, --events, --parents, --children and --days must be positive")
        spec = synthetic.SyntheticSpec(
            users=args.users,
            items=args.items,
            events=args.events,
            seed=args.seed,
            parents=args.parents,
            children=args.children,
            start=args.start,
            days=args.days,
        )
    elif not args.input:
        raise HirError(f"--input is required for --source {args.source}")
    return IngestConfig(
        source=args.source,
        inputs=tuple(args.input),
        warehouse=args.warehouse,
        ds=args.ds,
        max_reject_fraction=args.max_reject_fraction,
        mapping=args.mapping,
        run_id=args.run_id,
        synthetic=spec,
    )


def stage_source(spark: SparkSession, cfg: IngestConfig) -> tuple[DataFrame, SourceRules]:
    """The source's staged frame and its validation rules."""
    paths = list(cfg.inputs)
    if cfg.source == "taobao":
        return taobao.stage(spark, paths), taobao.RULES
    if cfg.source == "rees46":
        return rees46.stage(spark, paths), rees46.RULES
    if cfg.source == "generic":
        mapping = generic.load_mapping(cfg.mapping)
        return generic.stage(spark, paths, mapping), mapping.rules
    if cfg.source == "synthetic":
        assert cfg.synthetic is not None
        return synthetic.stage(spark, cfg.synthetic), synthetic.RULES
    raise HirError(f"unknown source '{cfg.source}' (choose from {', '.join(SOURCES)})")


def default_run_id(cfg: IngestConfig) -> str:
    key = json.dumps([cfg.source, sorted(cfg.inputs), str(cfg.ds), str(cfg.synthetic)])
    return f"{cfg.source}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def latest_attributes(events: DataFrame) -> DataFrame:
    """One row per (source, item, day): each attribute's last non-null value that day."""

    def last_non_null(column: str):
        return F.max(F.when(F.col(column).isNotNull(), F.struct("event_time", column)))[column].alias(column)

    return (
        events.groupBy("source", "item_id", "ds")
        .agg(
            *[last_non_null(c) for c in ("category_id", "category_code", "brand", "price", "title")],
            F.max("event_time").alias("last_seen"),
        )
        .select(
            "source",
            F.lit("item").alias("entity_type"),
            F.col("item_id").alias("entity_id"),
            "category_id",
            "category_code",
            "brand",
            "price",
            "title",
            "last_seen",
            "ds",
        )
    )


def ingest(spark: SparkSession, cfg: IngestConfig) -> IngestReport:
    """Parse, validate, de-duplicate and write one source's input; return the reconciliation."""
    log = StageLog("ingest", {"source": cfg.source})
    staged, rules = stage_source(spark, cfg)
    frame = canonicalize(staged, rules)
    if cfg.ds is not None:
        outside = F.concat(F.lit("event day "), F.col("ds").cast("string"), F.lit(f" is not --ds {cfg.ds}"))
        frame = frame.withColumn(
            "reason", F.coalesce("reason", F.when(F.col("ds") != F.lit(cfg.ds), outside))
        )
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _write(spark, cfg, frame, log)
    finally:
        frame.unpersist()


def _write(spark: SparkSession, cfg: IngestConfig, frame: DataFrame, log: StageLog) -> IngestReport:
    totals = frame.agg(F.count(F.lit(1)).alias("read"), F.count("reason").alias("rejects")).first()
    read, rejected = int(totals["read"]), int(totals["rejects"])
    if read == 0:
        raise HirError(f"no records in {', '.join(cfg.inputs) or cfg.source}: empty input (or header only)")
    # Reasons name the offending value after a quote; group on the text before it for the summary.
    reasons = {
        r["kind"]: int(r["n"])
        for r in frame.where(F.col("reason").isNotNull())
        .groupBy(F.trim(F.regexp_extract("reason", r"^[^'0-9]*", 0)).alias("kind"))
        .agg(F.count(F.lit(1)).alias("n"))
        .orderBy(F.desc("n"))
        .limit(10)
        .collect()
    }
    if rejected > cfg.max_reject_fraction * read:
        top = "; ".join(f"{k} x{v}" for k, v in list(reasons.items())[:3])
        raise HirError(
            f"{rejected} of {read} records rejected ({rejected / read:.1%} > --max-reject-fraction "
            f"{cfg.max_reject_fraction:g}): {top}; nothing written"
        )

    events = frame.where(F.col("reason").isNull()).dropDuplicates(["dedup_key"])
    events = events.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        n_events = events.count()
        days = sorted(str(r[0]) for r in events.select("ds").distinct().collect())
        files = [r[0] for r in frame.select("input_file").distinct().collect()]
        run_id = cfg.run_id or default_run_id(cfg)
        source_name = frame.select("source").first()[0]
        day_slice = f"source = '{source_name}' AND " + sql_in("ds", days)
        versions = {
            "events": write_table(events.select(*EVENTS.columns), EVENTS, cfg.warehouse, day_slice),
        }
        entities = latest_attributes(events)
        versions["entities"] = write_table(entities, ENTITIES, cfg.warehouse, day_slice)
        n_entities = read_table(spark, ENTITIES, cfg.warehouse).where(day_slice).count()
    finally:
        events.unpersist()
    rejects = frame.where(F.col("reason").isNotNull()).select(
        "source", "input_file", "record", "reason", F.lit(run_id).alias("run_id")
    )
    versions["ingest_rejects"] = write_table(
        rejects, INGEST_REJECTS, cfg.warehouse, f"source = '{source_name}' AND " + sql_in("input_file", files)
    )
    if cfg.synthetic is not None:
        versions["synthetic_truth"] = write_table(
            synthetic.truth(spark, cfg.synthetic), SYNTHETIC_TRUTH, cfg.warehouse, None
        )
    report = IngestReport(
        source=source_name,
        read=read,
        events=n_events,
        rejects=rejected,
        duplicates=(read - rejected) - n_events,
        days=tuple(days),
        entities=n_entities,
        reject_reasons=reasons,
        versions=versions,
    )
    log.counts.update(rows_in=read, rows_out=n_events, rejects=rejected, duplicates=report.duplicates)
    log.emit()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    spark = get_spark(f"hir-ingest-{cfg.source}", places={"--warehouse": cfg.warehouse})
    report = ingest(spark, cfg)
    print(report.line())
    if report.reject_reasons:
        print("  reject reasons: " + "; ".join(f"{k} x{v}" for k, v in report.reject_reasons.items()))
    return 0 if report.reconciles else 1


if __name__ == "__main__":
    sys.exit(run_job(main))
