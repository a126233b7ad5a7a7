"""Ranking teams read the daily tables without Spark: the `deltalake` package into pandas/Arrow."""

from __future__ import annotations

import datetime as dt

import numpy as np
from deltalake import DeltaTable

from jobs.common.delta import table_path, write_table
from schemas.tables import EMBEDDINGS


def test_embeddings_read_with_deltalake_equal_spark(spark, warehouse):
    day1, day2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)
    rows = [("item", i, f"i{i}", [float(i), 1.0, 0.5], "v1", day1) for i in range(1, 6)]
    write_table(spark.createDataFrame(rows, EMBEDDINGS.schema), EMBEDDINGS, warehouse, None)
    later = [("item", 9, "i9", [9.0, 9.0, 9.0], "v2", day2)]
    write_table(spark.createDataFrame(later, EMBEDDINGS.schema), EMBEDDINGS, warehouse, f"ds = DATE'{day2}'")

    table = DeltaTable(table_path(warehouse, EMBEDDINGS))
    assert table.version() == 2  # create + two writes
    pdf = table.to_pandas(partitions=[("ds", "=", str(day1))]).sort_values("node_id")
    assert list(pdf["raw_id"]) == [f"i{i}" for i in range(1, 6)]
    np.testing.assert_array_equal(np.stack(pdf["vector"].to_numpy())[:, 0], np.arange(1, 6, dtype=np.float32))
    # time travel: the version before day 2 was written has no day 2
    assert len(DeltaTable(table_path(warehouse, EMBEDDINGS), version=1).to_pandas()) == 5
    spark_count = spark.read.format("delta").load(table_path(warehouse, EMBEDDINGS)).count()
    assert len(table.to_pandas()) == spark_count == 6
