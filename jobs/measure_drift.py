"""Measure how far a day's embeddings and tokens moved from the previous day's: `representation_drift` and a report.

    hir drift --ds 2026-01-07 --warehouse warehouse/synthetic
    hir drift --ds 2017-12-03 --warehouse warehouse/taobao --max-drift 0.1
    spark-submit --jars .jars/delta-spark_4.0_2.13-4.4.0.jar,.jars/delta-storage-4.4.0.jar \\
      jobs/measure_drift.py --ds 2017-12-03 --warehouse warehouse/taobao --max-drift 0.1

Every entity embedded on ds and on the previous day embedded (default: the latest earlier ds of `embeddings`) is
compared with itself: the cosine of its two embeddings, whether its strongest level-0 and level-1 tokens kept their
ids, and, for a hash sample, the overlap of its 10 nearest same-type neighbours. The figures go to
`representation_drift` per entity type and cohort: the entities whose neighbourhood sample holds the same neighbour
ids on both days (unchanged), the others (changed), and all. `<warehouse>/reports/drift/report.md` plots every day
of the table. With --max-drift the day fails (exit 1, after the table and report are written) when, for an entity
type with at least --min-entities unchanged entities, 1 - their median cosine exceeds it: `hir pipeline` runs this
stage before build-index, so nothing is published from a day whose representation moved under its consumers.
A first day (nothing earlier embedded) writes nothing and passes.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from hir_model import storage
from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, parse_place, run_job
from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from jobs.common.stage import StageLog
from jobs.drift.measure import cohort_stats, day_view, neighbour_overlap, paired
from jobs.drift.report import write_drift_report
from schemas.tables import BOM_TOKENS, EMBEDDINGS, NEIGHBOURHOODS, REPRESENTATION_DRIFT


@dataclass(frozen=True)
class DriftConfig:
    ds: dt.date
    warehouse: str = "warehouse"
    previous_ds: dt.date | None = None  # default: the latest earlier ds in embeddings
    max_drift: float | None = None
    min_entities: int = 20
    overlap_sample: int = 1000
    overlap_corpus: int = 100_000
    report_dir: str | None = None  # default <warehouse>/reports/drift

    @property
    def reports(self) -> str:
        return self.report_dir or storage.join(self.warehouse, "reports", "drift")


@dataclass(frozen=True)
class DriftReport:
    ds: dt.date
    previous_ds: dt.date | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None  # over --max-drift: the day fails
    report_path: str | None = None

    def line(self) -> str:
        if self.previous_ds is None:
            return f"drift {self.ds}: no earlier day embedded, nothing to compare"
        parts = []
        for r in sorted(self.rows, key=lambda r: r["entity_type"]):
            if r["cohort"] != "unchanged" or not r["entities"]:
                continue
            cosine = "-" if r["cosine_p50"] is None else f"{r['cosine_p50']:.3f}"
            kept = "-" if r["level0_kept"] is None else f"{r['level0_kept']:.3f}"
            parts.append(
                f"{r['entity_type']} {r['entities']} unchanged: median cosine {cosine}, level-0 kept {kept}"
            )
        verdict = f"; OVER THRESHOLD: {self.problem}" if self.problem else ""
        return (
            f"drift {self.ds} vs {self.previous_ds}: "
            + ("; ".join(parts) or "no unchanged entities")
            + verdict
        )


def _unit_share(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 2.0:
        raise ValueError
    return number


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir drift", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--ds", type=parse_ds, required=True, help="Day to measure (YYYY-MM-DD); it must be embedded."
    )
    add_warehouse_flag(p)
    p.add_argument(
        "--previous-ds",
        type=parse_ds,
        help="Day to compare with. Default the latest earlier day in `embeddings`: a day skipped by the "
        "schedule is bridged, not reported as missing.",
    )
    p.add_argument(
        "--max-drift",
        type=_unit_share,
        help="Fail the day (exit 1) when 1 - the median cosine of an entity type's unchanged entities exceeds "
        "this (0-2). Default none: measured and reported, never failing. 0.1 (median cosine 0.9) is what "
        "warm-started days are built to hold.",
    )
    p.add_argument(
        "--min-entities",
        type=int,
        default=20,
        help="Unchanged entities an entity type needs before --max-drift judges it (default 20: a median of a "
        "handful is noise).",
    )
    p.add_argument(
        "--overlap-sample",
        type=int,
        default=1000,
        help="Entities per type whose nearest-neighbour overlap is measured (default 1000: the mean's standard "
        "error stays under 0.02).",
    )
    p.add_argument(
        "--overlap-corpus",
        type=int,
        default=100_000,
        help="Most entities per type searched for those neighbours, by hash order (default 100k: two exact "
        "searches of 1000 queries stay a few seconds on the driver).",
    )
    p.add_argument(
        "--report-dir",
        type=parse_place,
        help="Folder (path or URI) of the drift report. Default <warehouse>/reports/drift.",
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> DriftConfig:
    args = build_parser().parse_args(argv)
    for flag in ("min_entities", "overlap_sample", "overlap_corpus"):
        if getattr(args, flag) < 1:
            raise HirError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.previous_ds is not None and args.previous_ds >= args.ds:
        raise HirError(f"--previous-ds {args.previous_ds} must be before --ds {args.ds}")
    return DriftConfig(
        ds=args.ds,
        warehouse=args.warehouse,
        previous_ds=args.previous_ds,
        max_drift=args.max_drift,
        min_entities=args.min_entities,
        overlap_sample=args.overlap_sample,
        overlap_corpus=args.overlap_corpus,
        report_dir=args.report_dir,
    )


def previous_day(spark: SparkSession, cfg: DriftConfig) -> dt.date | None:
    embeddings = read_table(spark, EMBEDDINGS, cfg.warehouse)
    if embeddings.where(F.col("ds") == F.lit(cfg.ds)).limit(1).count() == 0:
        raise HirError(f"embeddings has no rows for ds {cfg.ds}: run embed for the day first")
    if cfg.previous_ds is not None:
        if embeddings.where(F.col("ds") == F.lit(cfg.previous_ds)).limit(1).count() == 0:
            raise HirError(f"--previous-ds {cfg.previous_ds}: embeddings has no rows for that day")
        return cfg.previous_ds
    return embeddings.where(F.col("ds") < F.lit(cfg.ds)).agg(F.max("ds")).first()[0]


def over_threshold(rows: Sequence[dict[str, Any]], cfg: DriftConfig) -> str | None:
    """Why the day fails --max-drift (None when it passes or no threshold is set)."""
    if cfg.max_drift is None:
        return None
    failures = []
    for r in rows:
        if r["cohort"] != "unchanged" or r["entities"] < cfg.min_entities:
            continue
        if r["cosine_p50"] is None:
            failures.append(f"{r['entity_type']}: the embedding size changed")
        elif 1.0 - r["cosine_p50"] > cfg.max_drift:
            failures.append(
                f"{r['entity_type']} drift {1.0 - r['cosine_p50']:.3f} (median cosine {r['cosine_p50']:.3f} over "
                f"{r['entities']} unchanged entities)"
            )
    return f"over --max-drift {cfg.max_drift:g}: " + "; ".join(failures) if failures else None


def measure(spark: SparkSession, cfg: DriftConfig) -> DriftReport:
    """Compare the day with the previous one, write its partition of representation_drift and the report."""
    log = StageLog("drift", {"ds": str(cfg.ds)})
    previous = previous_day(spark, cfg)
    if previous is None:
        log.emit()
        return DriftReport(cfg.ds, None)
    embeddings = read_table(spark, EMBEDDINGS, cfg.warehouse)
    tokens = read_table(spark, BOM_TOKENS, cfg.warehouse)
    neighbourhoods = read_table(spark, NEIGHBOURHOODS, cfg.warehouse)
    pairs = paired(
        day_view(embeddings, tokens, neighbourhoods, cfg.ds),
        day_view(embeddings, tokens, neighbourhoods, previous),
    ).cache()
    try:
        rows = [r.asDict() for r in cohort_stats(pairs).collect()]
        overlap = neighbour_overlap(pairs, cfg.overlap_sample, cfg.overlap_corpus)
    finally:
        pairs.unpersist()
    for r in rows:
        r["overlap_at_10"], r["overlap_sampled"] = overlap.get((r["entity_type"], r["cohort"]), (None, 0))
        r["previous_ds"] = previous
    fields = [f for f in REPRESENTATION_DRIFT.schema.fields if f.name != "ds"]
    frame = spark.createDataFrame(
        [tuple(r[f.name] for f in fields) for r in rows], schema=StructType(fields)
    ).withColumn("ds", F.lit(cfg.ds))
    write_table(frame, REPRESENTATION_DRIFT, cfg.warehouse, f"ds = DATE'{cfg.ds}'")
    history = [r.asDict() for r in read_table(spark, REPRESENTATION_DRIFT, cfg.warehouse).collect()]
    report_path = write_drift_report(cfg.reports, history, cfg.max_drift)
    log.counts.update(rows_out=len(rows), previous_ds=str(previous))
    log.emit()
    return DriftReport(cfg.ds, previous, rows, over_threshold(rows, cfg), str(report_path))


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    from jobs.common.spark import get_spark

    report = measure(get_spark(f"hir-drift-{cfg.ds}", places={"--warehouse": cfg.warehouse}), cfg)
    print(report.line())
    if report.report_path:
        print(f"report: {report.report_path}")
    return 1 if report.problem else 0


if __name__ == "__main__":
    sys.exit(run_job(main))
