"""Top items for a user from the live index: what a serving team calls, as a command.

    hir query --user-id 1042 -k 20
    hir query --user-id 1042 -k 20 --entity-type item --ds 2026-01-07 --warehouse warehouse --json
    hir query --user-id 1042 --warehouse s3a://bucket/warehouse     # a remote warehouse: the index is cached locally

Loads the index LATEST names (or, with --ds, that day's version), looks up the user's embedding in `embeddings`
at the day, model version and Delta version the index was built from (so query and index vectors come from the
same model), and prints the top k with raw ids, node ids and inner-product scores. Nothing is embedded here.
The Spark session starts first, so one set of `spark.hadoop.fs.s3a.*` settings reaches both the table and the
index. Serving processes use jobs.index.reader.IndexReader directly, without Spark.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.build_index import QUERY_ENTITY, entity_type_arg
from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, run_job
from jobs.common.delta import read_table
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.index.reader import NO_ID, IndexReader, open_index
from schemas.tables import EMBEDDINGS


@dataclass(frozen=True)
class QueryConfig:
    user_id: str
    k: int = 20
    entity_type: str = "item"
    ds: str | None = None
    warehouse: str = "warehouse"
    as_json: bool = False


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir query", description=__doc__.split("\n\n")[0])
    p.add_argument("--user-id", required=True, help="Raw user id as in the source events.")
    p.add_argument(
        "-k", "--k", type=int, default=20, help="Results to return. 20 fills a typical candidate slate."
    )
    p.add_argument(
        "--entity-type",
        type=entity_type_arg,
        default="item",
        help="Which index to search. Default item: user-to-item retrieval.",
    )
    p.add_argument(
        "--ds",
        type=parse_ds,
        help="Index day. Default: the day of the live (LATEST) version, so the answer is what serving sees.",
    )
    add_warehouse_flag(p)
    p.add_argument("--json", action="store_true", help="One JSON object per result instead of a table.")
    return p


def config_from_args(argv: Sequence[str] | None) -> QueryConfig:
    args = build_parser().parse_args(argv)
    if args.k < 1:
        raise HirError("-k must be at least 1")
    return QueryConfig(
        user_id=args.user_id,
        k=args.k,
        entity_type=args.entity_type,
        ds=None if args.ds is None else str(args.ds),
        warehouse=args.warehouse,
        as_json=args.json,
    )


def user_vector(spark: SparkSession, warehouse: str, user_id: str, manifest: dict) -> np.ndarray:
    """The user's embedding from the same day, model version and Delta version as the index."""
    version = manifest.get("source", {}).get("delta_version")
    rows = (
        read_table(spark, EMBEDDINGS, warehouse, version)
        .where(
            (F.col("ds") == F.lit(manifest["ds"]).cast("date"))
            & (F.col("entity_type") == QUERY_ENTITY)
            & (F.col("raw_id") == user_id)
            & (F.col("model_version") == manifest["model_version"])
        )
        .select("vector")
        .limit(2)
        .collect()
    )
    if len(rows) != 1:
        # node ids hash (source, type, raw id): the same raw id in two sources is two users
        problem = (
            "has no embedding" if not rows else "has several embeddings (same raw id in several sources)"
        )
        raise HirError(
            f"user '{user_id}' {problem} in embeddings for ds {manifest['ds']}, model version "
            f"{manifest['model_version']} (Delta version {version})"
        )
    return np.asarray(rows[0]["vector"], dtype=np.float32)


def top_k(reader: IndexReader, vector: np.ndarray, k: int) -> list[dict]:
    raw_ids, node_ids, scores = reader.search(vector, k)
    return [
        {"rank": rank + 1, "raw_id": raw, "node_id": int(node), "score": round(float(score), 6)}
        for rank, (raw, node, score) in enumerate(zip(raw_ids[0], node_ids[0], scores[0], strict=True))
        if node != NO_ID
    ]


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    spark = get_spark("hir-query", places={"--warehouse": cfg.warehouse})
    reader = open_index(cfg.warehouse, cfg.entity_type, cfg.ds)
    results = top_k(reader, user_vector(spark, cfg.warehouse, cfg.user_id, reader.manifest), cfg.k)
    m = reader.manifest
    if cfg.as_json:
        for row in results:
            print(json.dumps(row))
    else:
        print(f"# {m['entity_type']} index {m['ds']}/{m['run_id']} ({m['factory']}), user {cfg.user_id}")
        print(f"{'rank':>4}  {'raw_id':<24} {'node_id':>20}  score")
        for row in results:
            print(f"{row['rank']:>4}  {row['raw_id']!s:<24} {row['node_id']:>20}  {row['score']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
