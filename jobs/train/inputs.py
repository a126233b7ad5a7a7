"""The training job's inputs, pinned to Delta versions: the day's neighbourhoods, the deep-funnel edges and item
categories, the content vectors, and the next period's input rows and positives. This is the only Spark work of
`hir train`; everything after it reads the pinned snapshot files without Spark.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hir_model import storage
from jobs.common.delta import TableSnapshot, first_line, table_snapshot
from jobs.common.errors import HirError
from jobs.sample_neighbourhoods import SampleConfig
from jobs.train.continuity import PreviousTokens, read_previous_tokens
from jobs.train.next_period import NextPeriod, next_period

if TYPE_CHECKING:
    from jobs.train_encoder import TrainJobConfig

POSITIVE_EDGE_TYPES = ("user_cart_item", "user_purchase_item")  # deep funnel, user -> item
# Local day ds ends by ds+1 12:00 UTC in every time zone (the westmost is UTC-12); an edge of the day's graph whose
# last event is later than ds+1 14:00 UTC (2 h of slack) comes from after the training day.
_LATEST_OFFSET = dt.timedelta(days=1, hours=14)


@dataclass(frozen=True)
class TrainingInputs:
    """Everything training needs from Spark; the rest is read from the snapshot files without Spark."""

    neighbourhoods: TableSnapshot
    edges: dict[str, Any]  # path, version, ds, positives, positives_last_time
    content: TableSnapshot | None
    next_period: NextPeriod  # input rows before the training cut-off, positives after it
    category_items: np.ndarray  # (C,) items with a category edge, and their heaviest category
    category_ids: np.ndarray
    previous_tokens: PreviousTokens | None = None  # the latest earlier day's exact paths (token alignment)

    def versions(self) -> dict[str, int | str | None]:
        versions: dict[str, int | str | None] = {
            "neighbourhoods": self.neighbourhoods.version,
            "edges": self.edges["version"],
            "entity_content": self.content.version if self.content else None,
        }
        if self.previous_tokens is not None:  # the ids the day's tokens are renamed to
            versions["previous_tokens"] = self.previous_tokens.identity()
        return versions


def categories_of_items(
    spark, warehouse: str, version: int | None, ds: dt.date
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """Each item's heaviest category (the labels of the purity metric), from the day's edges.

    Refuses a graph whose deep-funnel edges have events after the training day: those belong to the
    evaluation period, and training on them would leak the answers.
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    from jobs.common.delta import read_table, table_path, table_version
    from schemas.tables import EDGES

    read_table(spark, EDGES, warehouse)  # one-line HirError when missing
    latest = table_version(spark, EDGES, warehouse)
    version = latest if version is None else version
    if version > latest:
        raise HirError(f"table edges has no version {version} (latest is {latest})")
    try:
        edges = read_table(spark, EDGES, warehouse, version).where(F.col("ds") == F.lit(ds))
        positives = (
            edges.where(F.col("edge_type").isin(*POSITIVE_EDGE_TYPES))
            .groupBy("src", "dst")
            .agg(F.date_format(F.max("last_time"), "yyyy-MM-dd'T'HH:mm:ss").alias("last_time"))
            .toPandas()
        )
        categories = (
            edges.where(F.col("edge_type") == "item_in_category")
            .groupBy("src")
            .agg(F.max(F.struct(F.col("weight"), (-F.col("dst")).alias("neg_dst"))).alias("best"))
            .select("src", (-F.col("best.neg_dst")).alias("category"))
            .toPandas()
        )
    except AnalysisException as err:
        raise HirError(f"table edges version {version}: {first_line(err)}") from None
    last_time = str(positives["last_time"].max()) if len(positives) else None
    bound = (dt.datetime.combine(ds, dt.time()) + _LATEST_OFFSET).isoformat()
    if last_time is not None and last_time >= bound:
        leaked = int((positives["last_time"] >= bound).sum())
        raise HirError(
            f"edges version {version} for ds {ds}: {leaked} cart/purchase edges have events after the day "
            f"(last {last_time}Z); the training graph must not contain the evaluation period"
        )
    lineage = {
        "table": "edges",
        "path": table_path(warehouse, EDGES),
        "version": version,
        "ds": str(ds),
        "positive_edges": len(positives),
        "positives_last_time": last_time,
        "items_with_category": len(categories),
    }
    as_ids = lambda series: series.to_numpy(dtype=np.int64)  # noqa: E731
    return lineage, as_ids(categories["src"]), as_ids(categories["category"])


def resolve_inputs(spark, cfg: TrainJobConfig) -> TrainingInputs:
    """Pin every input table to a version and resolve it to files (the only Spark work of the job)."""
    from jobs.common.delta import table_exists
    from schemas.tables import ENTITY_CONTENT, NEIGHBOURHOODS

    neighbourhoods = table_snapshot(spark, NEIGHBOURHOODS, cfg.warehouse, cfg.neighbourhoods_version, cfg.ds)
    if neighbourhoods.rows == 0:
        raise HirError(
            f"neighbourhoods version {neighbourhoods.version} has no rows for ds {cfg.ds}: run "
            "sample_neighbourhoods for the day"
        )
    edges, cat_items, cat_ids = categories_of_items(spark, cfg.warehouse, cfg.edges_version, cfg.ds)
    period = next_period(
        spark,
        cfg.warehouse,
        cfg.ds,
        cfg.train_cutoff,
        cfg.next_period_share,
        dict(cfg.positive_weights),
        SampleConfig(ds=cfg.ds),
        neighbourhoods_max_tokens(neighbourhoods),
        cfg.validation_share,
        cfg.train_periods,
    )
    content = None
    if cfg.use_content and (
        cfg.content_version is not None or table_exists(spark, ENTITY_CONTENT, cfg.warehouse)
    ):
        content = table_snapshot(spark, ENTITY_CONTENT, cfg.warehouse, cfg.content_version, None)
    previous = read_previous_tokens(spark, cfg.warehouse, cfg.ds) if cfg.align_tokens else None
    return TrainingInputs(neighbourhoods, edges, content, period, cat_items, cat_ids, previous)


def neighbourhoods_max_tokens(snapshot: TableSnapshot) -> int:
    """Row length of the day's neighbourhoods (the input rows are cut to the same), from one file's first row."""
    import pyarrow.parquet as pq

    fs, path = storage.filesystem(snapshot.files[0])
    with fs.open_input_file(path) as handle:
        first = pq.ParquetFile(handle).read_row_group(0, columns=["token_node_id"]).slice(0, 1)
    return len(first.column(0)[0])
