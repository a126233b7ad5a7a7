"""Query the pipeline's tables by name with Spark SQL: every table under the warehouse is a view of its name.

    hir sql --warehouse warehouse/rees46 -e "SELECT token, label, size FROM bom_vocab ORDER BY size DESC LIMIT 5"
    hir sql --warehouse warehouse/rees46 -f docs/sql/top_tokens_of_brand_purchasers.sql -p brand=samsung -p ds=2019-10-01
    hir sql --warehouse warehouse/rees46 -e "SELECT * FROM events LIMIT 3" --format csv

Parameters are bound by Spark (`:name` markers), never pasted into the text.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.utils import AnalysisException, ParseException

from jobs.common.args import JobArgumentParser, add_warehouse_flag, run_job
from jobs.common.delta import table_exists, table_path
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from schemas.tables import ALL_TABLES


@dataclass(frozen=True)
class SqlConfig:
    query: str
    warehouse: str = "warehouse"
    params: tuple[tuple[str, str], ...] = ()
    format: str = "table"
    limit: int = 1000


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir sql", description=__doc__.split("\n\n")[0])
    add_warehouse_flag(p)
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("-e", "--execute", help="SQL text to run.")
    q.add_argument("-f", "--file", help="File holding one SQL query (see docs/sql/).")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        help="NAME=VALUE bound to :NAME in the query (repeatable).",
    )
    p.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="table for people; csv and json (one object per line) for scripts.",
    )
    p.add_argument(
        "--limit", type=int, default=1000, help="Rows printed at most: a terminal is not a data export."
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> SqlConfig:
    a = build_parser().parse_args(argv)
    if a.file:
        if not Path(a.file).is_file():
            raise HirError(f"query file not found: {a.file}")
        query = Path(a.file).read_text()
    else:
        query = a.execute
    params = []
    for item in a.param:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise HirError(f"--param must be NAME=VALUE, got '{item}'")
        params.append((name, value))
    return SqlConfig(query.strip().rstrip(";"), a.warehouse, tuple(params), a.format, a.limit)


def register_tables(spark: SparkSession, warehouse: str) -> list[str]:
    """Create a temp view per existing table; return their names."""
    if "://" not in warehouse and not Path(warehouse).is_dir():
        raise HirError(f"warehouse not found: {warehouse}")
    names = []
    for name, spec in ALL_TABLES.items():
        if table_exists(spark, spec, warehouse):
            spark.read.format("delta").load(table_path(warehouse, spec)).createOrReplaceTempView(name)
            names.append(name)
    return names


def run_query(spark: SparkSession, cfg: SqlConfig) -> DataFrame:
    register_tables(spark, cfg.warehouse)
    try:
        return spark.sql(cfg.query, args=dict(cfg.params) or None)
    except (AnalysisException, ParseException) as exc:
        raise HirError(f"query failed: {str(exc).splitlines()[0]}") from None


def render(df: DataFrame, fmt: str, limit: int) -> str:
    pdf = df.limit(limit).toPandas()
    if fmt == "csv":
        return pdf.to_csv(index=False).rstrip("\n")
    if fmt == "json":
        return "\n".join(json.dumps(rec, default=str) for rec in pdf.to_dict(orient="records"))
    return pdf.to_string(index=False) if len(pdf) else "(no rows)"


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    spark = get_spark("hir-sql", places={"--warehouse": cfg.warehouse})
    print(render(run_query(spark, cfg), cfg.format, cfg.limit))
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
