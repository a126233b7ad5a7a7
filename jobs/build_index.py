"""Build a FAISS retrieval index from the `embeddings` table, tune it to a recall target and publish it atomically.

    spark-submit jobs/build_index.py --ds 2026-01-07 --warehouse warehouse
    hir build-index --ds 2026-01-07 --entity-type item --recall-target 0.95 --keep-versions 3
    hir build-index --ds 2026-01-07 --index-factory IVF1024,Flat --table-version 12
    hir build-index --ds 2026-01-07 --build-on spark --shards 16     # IVF shards built in Spark tasks, merged

One day's vectors of one entity type are read at a Delta version (recorded in the manifest). The index type
follows from the number of vectors and --memory-budget (jobs.index.choose.choose_factory; --index-factory
overrides it). It is trained on a deterministic sample (lowest xxhash64 of the node id), filled with every vector
under its int64 node id, and its search parameter (nprobe / efSearch) is raised until recall@10 against exact
inner-product search reaches --recall-target on held-out queries (the day's user embeddings, or the vectors with
the highest hash). Below the target nothing is published. Otherwise the version is written to
<warehouse>/indexes/<entity_type>/<ds>/<run_id>/ and made live by an atomic swap of LATEST (jobs.index.publish);
`hir query` and jobs.index.reader.IndexReader read it. On an s3a:// or hdfs:// warehouse the version is built in a
local temporary folder, uploaded with its manifest last, and made live by writing LATEST in one step.

Single-node builds collect the vectors to the driver through Arrow. From --spark-min-vectors (or with
--build-on spark), IVF indexes are built in Spark tasks: the driver trains an empty index, broadcasts it, each
task adds its partition's vectors and computes that partition's exact top-10 for the queries, and the driver
merges the shards' inverted lists and the partial top-10s. The merged index equals a single-node build.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import math
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from hir_model import storage
from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, run_job
from jobs.common.delta import read_table, table_path, table_version
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.common.stage import StageLog
from jobs.index import build
from jobs.index.choose import (
    MAX_TRAIN_VECTORS,
    TRAIN_POINTS_PER_LIST,
    choose_factory,
    format_bytes,
    parse_bytes,
)
from jobs.index.publish import ID_MAP_FILE, INDEX_FILE, entity_root, publish, read_latest
from jobs.index.reader import load_manifest
from schemas.codes import NODE_TYPES
from schemas.tables import EMBEDDINGS

DEFAULT_MEMORY_BUDGET = 4 * 2**30
# Rows collected to the driver per Arrow transfer: well under spark.driver.maxResultSize (1 GiB by default).
COLLECT_CHUNK_BYTES = 256 * 2**20
# Vectors per Spark shard: the serialized shard travels to the driver as one value.
SHARD_BYTES = 256 * 2**20
QUERY_ENTITY = "user"  # retrieval serves users: their embeddings are the natural queries of every index


@dataclass(frozen=True)
class BuildConfig:
    ds: dt.date
    warehouse: str = "warehouse"
    entity_type: str = "item"
    table_version: int | None = None
    model_version: str | None = None
    index_factory: str | None = None
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET
    recall_target: float = 0.95
    recall_queries: int = 1000
    keep_versions: int = 3
    run_id: str | None = None
    device: str = "auto"
    build_on: str = "auto"
    spark_min_vectors: int = 5_000_000
    shards: int = 0
    add_batch: int = 65_536
    seed: int = 1234


@dataclass(frozen=True)
class BuildReport:
    version_dir: str  # the published version: a local path or a URI
    manifest: dict
    pruned: list[str] = field(default_factory=list)

    def line(self) -> str:
        m = self.manifest
        params = ",".join(f"{k}={v}" for k, v in m["search_params"].items()) or "exact"
        return (
            f"published {m['entity_type']} index {m['factory']} ({params}): {m['count']} vectors, "
            f"recall@10 {m['recall_at_10']:.3f} >= {m['recall_target']}, {m['qps']:.0f} QPS; "
            f"LATEST -> {m['ds']}/{m['run_id']}" + (f"; pruned {len(self.pruned)}" if self.pruned else "")
        )


def entity_type_arg(value: str) -> str:
    """An entity type as stored in `embeddings` (user, item, advertiser, category); plurals accepted."""
    name = value.strip().lower()
    name = name[:-1] if name.endswith("s") and name[:-1] in NODE_TYPES else name
    if name not in NODE_TYPES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(NODE_TYPES)}, got '{value}'")
    return name


def memory_budget_arg(value: str) -> int:
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir build-index", description=__doc__.split("\n\n")[0])
    p.add_argument("--ds", type=parse_ds, required=True, help="Day of the embeddings to index (YYYY-MM-DD).")
    add_warehouse_flag(p)
    p.add_argument(
        "--entity-type",
        type=entity_type_arg,
        default="item",
        help="Entity type to index. Default item: retrieval looks up items for a user.",
    )
    p.add_argument(
        "--table-version",
        type=int,
        help="Delta version of `embeddings` to read. Default: the latest, recorded in the manifest so the "
        "build can be reproduced.",
    )
    p.add_argument(
        "--model-version",
        help="Model version to index when the day holds several. Default: the only one present.",
    )
    p.add_argument(
        "--index-factory",
        help="faiss factory string (e.g. IVF1024,Flat or HNSW32) overriding the size/memory rule; metric is "
        "always inner product. Default: choose_factory(n, dim, --memory-budget).",
    )
    p.add_argument(
        "--memory-budget",
        type=memory_budget_arg,
        default=DEFAULT_MEMORY_BUDGET,
        help="Most RAM the loaded index may take (e.g. 4GiB, 512M). Default 4GiB: a serving replica of 16 GiB "
        "holds the live index and the next one while it hot-swaps, with half its memory left for the process.",
    )
    p.add_argument(
        "--recall-target",
        type=float,
        default=0.95,
        help="Recall@10 against exact search the tuned index must reach, or nothing is published. 0.95 is "
        "the usual serving bar (autofaiss, ANN benchmarks): one neighbour in 20 lost for 10-100x speed.",
    )
    p.add_argument(
        "--recall-queries",
        type=int,
        default=1000,
        help="Held-out queries for recall and latency. 1000 x 10 neighbour checks measure recall to about "
        "+-0.01 in seconds.",
    )
    p.add_argument(
        "--keep-versions",
        type=int,
        default=3,
        help="Published versions kept per entity type (the live one always is). 3 keeps two to roll back to.",
    )
    p.add_argument(
        "--run-id",
        help="Version folder name. Default: UTC time plus a random suffix, so every build is a new version.",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="Where k-means training and exact search run. auto: a GPU when the faiss build supports it and "
        "one is visible; the published index is a CPU index either way.",
    )
    p.add_argument(
        "--build-on",
        choices=("auto", "driver", "spark"),
        default="auto",
        help="driver: collect vectors and build in one process; spark: build IVF shards in Spark tasks and "
        "merge. auto: spark for IVF indexes from --spark-min-vectors.",
    )
    p.add_argument(
        "--spark-min-vectors",
        type=int,
        default=5_000_000,
        help="Size from which auto builds in Spark tasks. 5M x 128 floats is 2.5 GB: below it one process "
        "adds faster than a Spark round trip; above it the adds (the costly part) spread over executors.",
    )
    p.add_argument(
        "--shards",
        type=int,
        default=0,
        help="Spark tasks (shards) for --build-on spark. Default 0: the cluster's default parallelism, more "
        "when shards would exceed 256 MiB.",
    )
    p.add_argument(
        "--add-batch",
        type=int,
        default=65_536,
        help="Vectors per add call; 64k x 128 floats is 32 MB of temporary buffers.",
    )
    p.add_argument("--seed", type=int, default=1234, help="k-means seed (faiss's own default).")
    return p


def config_from_args(argv: Sequence[str] | None) -> BuildConfig:
    args = build_parser().parse_args(argv)
    if not 0 < args.recall_target <= 1:
        raise HirError("--recall-target must be in (0, 1]")
    if args.recall_queries < 1 or args.keep_versions < 1 or args.add_batch < 1 or args.shards < 0:
        raise HirError("--recall-queries, --keep-versions and --add-batch must be positive, --shards >= 0")
    return BuildConfig(
        ds=args.ds,
        warehouse=args.warehouse,
        entity_type=args.entity_type,
        table_version=args.table_version,
        model_version=args.model_version,
        index_factory=args.index_factory,
        memory_budget_bytes=args.memory_budget,
        recall_target=args.recall_target,
        recall_queries=args.recall_queries,
        keep_versions=args.keep_versions,
        run_id=args.run_id,
        device=args.device,
        build_on=args.build_on,
        spark_min_vectors=args.spark_min_vectors,
        shards=args.shards,
        add_batch=args.add_batch,
        seed=args.seed,
    )


def default_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


# ------------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Source:
    """The slice of `embeddings` being indexed: the DataFrame (with sample_key) and what it holds."""

    vectors: DataFrame  # node_id, raw_id, vector, sample_key
    queries: DataFrame  # node_id, vector, sample_key: user embeddings of the day, or the vectors themselves
    query_source: str
    delta_version: int
    model_version: str
    count: int
    dimension: int


def with_sample_key(df: DataFrame) -> DataFrame:
    # xxhash64 of the node id: a row's place in the sample does not depend on partitioning or on other rows.
    return df.withColumn("sample_key", F.xxhash64("node_id"))


def read_source(spark: SparkSession, cfg: BuildConfig) -> Source:
    """The day's vectors of one entity type and model version, checked: one dimension, unique node ids."""
    read_table(spark, EMBEDDINGS, cfg.warehouse)  # a missing table is a one-line error
    version = cfg.table_version
    if version is None:
        version = table_version(spark, EMBEDDINGS, cfg.warehouse)
    try:
        table = read_table(spark, EMBEDDINGS, cfg.warehouse, version)
    except AnalysisException as exc:
        raise HirError(f"cannot read embeddings at version {version}: {str(exc).splitlines()[0]}") from None
    day = table.where(F.col("ds") == F.lit(cfg.ds))
    where = f"embeddings (Delta version {version}) for ds {cfg.ds}"
    models = sorted(
        r[0]
        for r in day.where(F.col("entity_type") == cfg.entity_type)
        .select("model_version")
        .distinct()
        .collect()
    )
    if not models:
        raise HirError(f"no '{cfg.entity_type}' vectors in {where}: run the embed stage first")
    model = cfg.model_version or models[0]
    if cfg.model_version is None and len(models) > 1:
        raise HirError(f"{where} holds model versions {', '.join(models)}: pick one with --model-version")
    if model not in models:
        raise HirError(f"model version '{model}' has no '{cfg.entity_type}' vectors in {where} ({models})")
    day = day.where(F.col("model_version") == model)
    vectors = with_sample_key(day.where(F.col("entity_type") == cfg.entity_type)).select(
        "node_id", "raw_id", "vector", "sample_key"
    )
    stats = vectors.agg(
        F.count(F.lit(1)).alias("n"),
        F.countDistinct("node_id").alias("ids"),
        F.min(F.size("vector")).alias("dmin"),
        F.max(F.size("vector")).alias("dmax"),
    ).first()
    n, dim = int(stats["n"]), int(stats["dmax"])
    if stats["ids"] != n:
        raise HirError(
            f"{where}: {n - stats['ids']} duplicate '{cfg.entity_type}' node ids; ids must be unique"
        )
    if stats["dmin"] != dim or dim < 1:
        raise HirError(f"{where}: vector lengths range from {stats['dmin']} to {dim}; all must be equal")
    users = with_sample_key(day.where(F.col("entity_type") == QUERY_ENTITY)).select(
        "node_id", "vector", "sample_key"
    )
    use_users = cfg.entity_type != QUERY_ENTITY and users.limit(1).count() > 0
    return Source(
        vectors=vectors,
        queries=users if use_users else vectors.select("node_id", "vector", "sample_key"),
        query_source="user embeddings" if use_users else f"held-out {cfg.entity_type} vectors",
        delta_version=version,
        model_version=model,
        count=n,
        dimension=dim,
    )


def arrow_arrays(df: DataFrame, dim: int) -> dict[str, np.ndarray]:
    """A DataFrame's columns as numpy through one Arrow transfer; `vector` becomes an (n, dim) float32 matrix."""
    table = df.toArrow()
    out: dict[str, np.ndarray] = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if name == "vector":
            out[name] = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
        elif name == "raw_id":
            out[name] = np.asarray(column.to_pylist(), dtype=object)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def collect_arrays(df: DataFrame, n: int, dim: int) -> dict[str, np.ndarray]:
    """All rows on the driver, in Arrow chunks of at most COLLECT_CHUNK_BYTES, sorted by node id."""
    chunks = max(1, math.ceil(n * (4 * dim + 64) / COLLECT_CHUNK_BYTES))
    if chunks == 1:
        parts = [arrow_arrays(df, dim)]
    else:
        df = df.persist()
        try:
            bucket = F.pmod(F.col("sample_key"), F.lit(chunks))
            parts = [arrow_arrays(df.where(bucket == b), dim) for b in range(chunks)]
        finally:
            df.unpersist()
    arrays = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    order = np.argsort(arrays["node_id"], kind="stable")
    return {name: values[order] for name, values in arrays.items()}


def sample(df: DataFrame, size: int, dim: int, *, tail: bool = False) -> dict[str, np.ndarray]:
    """The `size` rows first (or, tail=True, last) in (sample_key, node_id) order, in that order."""
    keys = [F.col("sample_key"), F.col("node_id")]
    picked = df.orderBy(*[k.desc() if tail else k for k in keys]).limit(size)
    arrays = arrow_arrays(picked, dim)
    order = build.sample_order(arrays["sample_key"], arrays["node_id"])
    order = order[::-1] if tail else order
    return {name: values[order] for name, values in arrays.items()}


# ---------------------------------------------------------------------------------------------- building


@dataclass
class Outcome:
    """A filled index with its id map, the exact top 10 of the queries, and how it was built."""

    index: faiss.Index
    node_ids: np.ndarray  # sorted
    raw_ids: np.ndarray
    exact_ids: np.ndarray
    exact_qps: float | None
    train_size: int
    mode: str
    shards: int = 1


def build_on_driver(
    source: Source, queries: np.ndarray, factory: str, cfg: BuildConfig, device: str
) -> Outcome:
    arrays = collect_arrays(source.vectors, source.count, source.dimension)
    built = build.build_in_memory(
        factory,
        arrays["vector"],
        arrays["node_id"],
        arrays["sample_key"],
        batch=cfg.add_batch,
        seed=cfg.seed,
        device=device,
    )
    start = time.perf_counter()
    _, exact_ids = build.exact_top_k(
        arrays["vector"], arrays["node_id"], queries, build.RECALL_K, device=device
    )
    exact_qps = len(queries) / max(time.perf_counter() - start, 1e-9)  # the truth's own brute-force pass
    return Outcome(
        built.index, arrays["node_id"], arrays["raw_id"], exact_ids, exact_qps, built.train_size, "driver"
    )


def _shard_task(
    index_bc, queries_bc, k: int, batch: int, dim: int, frames: Iterator[pd.DataFrame]
) -> Iterator[pd.DataFrame]:
    """mapInPandas body: one partition -> one row holding its shard and its exact top k for the queries."""
    from pyspark import TaskContext

    context = TaskContext.get()
    faiss.omp_set_num_threads(max(1, context.cpus()))  # share the executor's cores with its other tasks
    ids, vectors = [np.empty(0, dtype=np.int64)], [np.empty((0, dim), dtype=np.float32)]
    for frame in frames:
        if len(frame):
            ids.append(frame["node_id"].to_numpy(np.int64))
            vectors.append(np.stack(frame["vector"].to_numpy()).astype(np.float32))
    blob, scores, exact = build.add_shard(
        index_bc.value, np.concatenate(vectors), np.concatenate(ids), queries_bc.value, k, batch
    )
    yield pd.DataFrame(
        {
            "shard": [context.partitionId()],
            "count": [sum(len(i) for i in ids)],
            "index": [blob],
            "exact_scores": [scores.astype(np.float32).tobytes()],
            "exact_ids": [exact.astype(np.int64).tobytes()],
        }
    )


def build_on_spark(
    spark: SparkSession, source: Source, queries: np.ndarray, factory: str, cfg: BuildConfig, device: str
) -> Outcome:
    """Train on the driver, add in Spark tasks (one shard per partition), merge the shards on the driver."""
    dim, k = source.dimension, build.RECALL_K
    empty = build.new_index(factory, dim)
    if not build.is_ivf(empty):
        raise HirError(
            f"--build-on spark needs an IVF index (shards merge list by list); '{factory}' is not one"
        )
    size = build.train_size_for(empty, source.count, TRAIN_POINTS_PER_LIST, MAX_TRAIN_VECTORS)
    train = sample(source.vectors, size, dim)
    build.train_index(empty, train["vector"], seed=cfg.seed, device=device)
    blob = build.serialize(empty)
    shards = cfg.shards or max(
        spark.sparkContext.defaultParallelism, math.ceil(source.count * (4 * dim + 8) / SHARD_BYTES)
    )
    index_bc = spark.sparkContext.broadcast(blob)
    queries_bc = spark.sparkContext.broadcast(np.ascontiguousarray(queries, dtype=np.float32))
    schema = "shard int, count long, index binary, exact_scores binary, exact_ids binary"
    task = functools.partial(_shard_task, index_bc, queries_bc, k, cfg.add_batch, dim)
    out = (
        source.vectors.select("node_id", "vector")
        .repartition(shards, "node_id")
        .mapInPandas(task, schema)
        .persist()
    )
    try:
        out.count()  # build every shard in parallel; then fetch them one at a time
        index = build.deserialize(blob)
        partial_top: list[tuple[np.ndarray, np.ndarray]] = []
        for row in out.toLocalIterator():
            faiss.merge_into(index, build.deserialize(bytes(row["index"])), False)
            partial_top.append(
                (
                    np.frombuffer(row["exact_scores"], dtype=np.float32).reshape(len(queries), k),
                    np.frombuffer(row["exact_ids"], dtype=np.int64).reshape(len(queries), k),
                )
            )
    finally:
        out.unpersist()
        index_bc.destroy()
        queries_bc.destroy()
    if index.ntotal != source.count:
        raise HirError(f"merged shards hold {index.ntotal} vectors, expected {source.count}")
    _, exact_ids = build.merge_top_k(partial_top, k)
    id_map = collect_arrays(source.vectors.select("node_id", "raw_id", "sample_key"), source.count, dim)
    return Outcome(index, id_map["node_id"], id_map["raw_id"], exact_ids, None, size, "spark", shards)


def pick_build_on(cfg: BuildConfig, factory: str, n: int, dim: int) -> str:
    if cfg.build_on != "auto":
        return cfg.build_on
    return "spark" if n >= cfg.spark_min_vectors and build.is_ivf(build.new_index(factory, dim)) else "driver"


def write_version_files(index: faiss.Index, node_ids: np.ndarray, raw_ids: np.ndarray, folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    faiss.write_index(index, str(folder / INDEX_FILE))
    pq.write_table(
        pa.table(
            {"node_id": pa.array(node_ids, pa.int64()), "raw_id": pa.array(raw_ids.tolist(), pa.string())}
        ),
        folder / ID_MAP_FILE,
    )


def build_index(spark: SparkSession, cfg: BuildConfig, *, before_swap=None) -> BuildReport:
    """Read, choose, build, tune, and publish (only when the recall target is met)."""
    log = StageLog("build_index", {"entity_type": cfg.entity_type, "ds": str(cfg.ds)})
    storage.check_reachable(cfg.warehouse, "--warehouse")  # one line, before anything is read or written
    root = entity_root(cfg.warehouse, cfg.entity_type)
    device = build.resolve_device(cfg.device)
    source = read_source(spark, cfg)
    n, dim = source.count, source.dimension
    if cfg.index_factory:
        factory, reason = cfg.index_factory, "explicit --index-factory"
        build.new_index(factory, dim)  # a bad string fails here, before any work
    else:
        choice = choose_factory(n, dim, cfg.memory_budget_bytes)
        factory, reason = choice.factory, choice.reason
    queries = sample(source.queries, cfg.recall_queries, dim, tail=True)["vector"]

    mode = pick_build_on(cfg, factory, n, dim)
    start = time.perf_counter()
    if mode == "spark":
        outcome = build_on_spark(spark, source, queries, factory, cfg, device)
    else:
        outcome = build_on_driver(source, queries, factory, cfg, device)
    build_seconds = time.perf_counter() - start

    tuning = build.tune(outcome.index, queries, outcome.exact_ids, cfg.recall_target)
    params_text = ",".join(f"{k}={v}" for k, v in tuning.params.items()) or "no search parameter"
    if not tuning.reached:
        live = read_latest(root)
        raise HirError(
            f"{cfg.entity_type} index {factory} reaches recall@10 {tuning.recall:.3f} at best ({params_text}), "
            f"below --recall-target {cfg.recall_target}: not published, LATEST still "
            f"{'points to ' + live if live else 'absent'}. Raise --memory-budget or pass a more exact "
            "--index-factory"
        )
    speed = build.measure_speed(outcome.index, queries, build.RECALL_K)
    manifest = {
        "entity_type": cfg.entity_type,
        "factory": factory,
        "factory_reason": reason,
        "metric": build.METRIC_NAME,
        "search_params": tuning.params,
        "count": n,
        "dimension": dim,
        "recall_at_10": round(tuning.recall, 4),
        "recall_target": cfg.recall_target,
        "recall_queries": len(queries),
        "query_source": source.query_source,
        "qps": round(speed.qps, 1),
        "latency_ms_p50": round(speed.latency_ms_p50, 3),
        "latency_ms_p99": round(speed.latency_ms_p99, 3),
        "exact_qps": None if outcome.exact_qps is None else round(outcome.exact_qps, 1),
        "tuning": tuning.trace,
        "faiss_version": faiss.__version__,
        "model_version": source.model_version,
        "source": {
            "table": EMBEDDINGS.name,
            "path": table_path(cfg.warehouse, EMBEDDINGS),
            "delta_version": source.delta_version,
            "ds": str(cfg.ds),
            "entity_type": cfg.entity_type,
        },
        "build": {
            "mode": outcome.mode,
            "shards": outcome.shards,
            "device": device,
            "train_size": outcome.train_size,
            "seed": cfg.seed,
            "seconds": round(build_seconds, 3),
            "memory_budget_bytes": cfg.memory_budget_bytes,
        },
    }
    version_dir, pruned = publish(
        root,
        str(cfg.ds),
        cfg.run_id or default_run_id(),
        functools.partial(write_version_files, outcome.index, outcome.node_ids, outcome.raw_ids),
        manifest,
        keep=cfg.keep_versions,
        before_swap=before_swap,
    )
    published = load_manifest(version_dir)
    size = published["files"][INDEX_FILE]["bytes"]
    if size > cfg.memory_budget_bytes:
        print(f"warning: index is {format_bytes(size)}, over --memory-budget", file=sys.stderr)
    log.counts.update(
        rows_in=n, rows_out=n, factory=factory, recall=round(tuning.recall, 4), mode=outcome.mode
    )
    log.emit()
    return BuildReport(version_dir, published, pruned)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    spark = get_spark(f"hir-build-index-{cfg.entity_type}", places={"--warehouse": cfg.warehouse})
    report = build_index(spark, cfg)
    print(report.line())
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
