"""Table contracts: the writer refuses what does not match, replaces only its slice, keeps docs."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import functions as F

from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from schemas.tables import ALL_TABLES, EVENTS

ROW = ("taobao", "1", "2", "pv", "view", dt.datetime(2017, 11, 25), None, dt.date(2017, 11, 25))


def test_every_table_is_documented_and_partitioned_by_declared_columns():
    for spec in ALL_TABLES.values():
        assert spec.doc
        for f in spec.schema.fields:
            assert f.metadata.get("comment"), f"{spec.name}.{f.name} has no doc"
        assert set(spec.partition_by) <= set(spec.columns)


def test_writer_refuses_missing_and_mistyped_columns(spark, warehouse):
    good = spark.createDataFrame([ROW], EVENTS.schema)
    with pytest.raises(HirError, match="table events: column 'session_id' is missing"):
        write_table(good.drop("session_id"), EVENTS, warehouse, None)
    with pytest.raises(HirError, match="column 'event_time' has type string, declared timestamp"):
        write_table(good.withColumn("event_time", F.lit("x")), EVENTS, warehouse, None)
    with pytest.raises(HirError, match="column 'extra' is not declared"):
        write_table(good.withColumn("extra", F.lit(1)), EVENTS, warehouse, None)


def test_writer_replaces_its_day_only_and_keeps_column_docs(spark, warehouse):
    day2 = ROW[:-1] + (dt.date(2017, 11, 26),)
    write_table(spark.createDataFrame([ROW, day2], EVENTS.schema), EVENTS, warehouse, None)
    replacement = ROW[:1] + ("7",) + ROW[2:]
    write_table(
        spark.createDataFrame([replacement], EVENTS.schema), EVENTS, warehouse, "ds = DATE'2017-11-25'"
    )
    write_table(
        spark.createDataFrame([replacement], EVENTS.schema), EVENTS, warehouse, "ds = DATE'2017-11-25'"
    )
    rows = sorted((r["user_id"], str(r["ds"])) for r in read_table(spark, EVENTS, warehouse).collect())
    assert rows == [("1", "2017-11-26"), ("7", "2017-11-25")]
    table = read_table(spark, EVENTS, warehouse)
    assert table.schema["funnel_stage"].metadata["comment"].startswith("Canonical stage")
    with pytest.raises(Exception, match="(?i)replaceWhere|does not conform|Written data"):
        write_table(spark.createDataFrame([day2], EVENTS.schema), EVENTS, warehouse, "ds = DATE'2017-11-25'")


def test_a_table_written_before_a_nullable_column_was_declared_gains_it_and_keeps_its_rows(spark, warehouse):
    """eval_metrics got `task` after tables existed: the old rows stay and read NULL there, new rows write it."""
    from dataclasses import replace

    from pyspark.sql.types import StructType

    from schemas.tables import EVAL_METRICS

    old_spec = replace(
        EVAL_METRICS, schema=StructType([f for f in EVAL_METRICS.schema.fields if f.name != "task"])
    )
    row = {"dataset": "d", "protocol": "p", "model_version": "m", "method": "hir", "candidates": "graph",
           "slice": "all", "metric": "recall", "k": 10, "value": 0.5, "ci_low": 0.4, "ci_high": 0.6,
           "num_users": 3, "ds": dt.date(2026, 1, 1)}  # fmt: skip
    old = spark.createDataFrame([row], old_spec.schema)
    write_table(old, old_spec, warehouse, None)
    new = spark.createDataFrame([{**row, "task": "ranking", "ds": dt.date(2026, 1, 2)}], EVAL_METRICS.schema)
    write_table(new, EVAL_METRICS, warehouse, "ds = DATE'2026-01-02'")
    rows = {r["ds"]: r for r in read_table(spark, EVAL_METRICS, warehouse).collect()}
    assert rows[dt.date(2026, 1, 1)]["task"] is None and rows[dt.date(2026, 1, 1)]["value"] == 0.5
    assert rows[dt.date(2026, 1, 2)]["task"] == "ranking"
