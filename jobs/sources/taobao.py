"""Taobao UserBehavior (Tianchi 649): user_id,item_id,category_id,behavior_type,timestamp.

Files may have a header (the curated user-complete file) or not (raw slices), CRLF or LF endings. Calendar days
are in Asia/Shanghai. pv is a detail-page view (upper funnel), fav a favourite, cart and buy the deep funnel.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.sources.canonical import SourceRules, epoch_seconds_to_timestamp, field_at, split_fields
from jobs.sources.text import read_lines

HEADER = "user_id,item_id,category_id,behavior_type,timestamp"
RULES = SourceRules(
    name="taobao",
    stage_map={"pv": "view", "fav": "favourite", "cart": "cart", "buy": "purchase"},
    timezone="Asia/Shanghai",
)


def stage(spark: SparkSession, paths: list[str]) -> DataFrame:
    lines = read_lines(spark, paths, HEADER)
    fields, structural = split_fields(F.col("record"), ",", 5, "malformed line")
    time_raw = field_at(fields, 4)
    return lines.select(
        "input_file",
        "record",
        F.col("record").alias("dedup_key"),
        structural.alias("structural_reason"),
        field_at(fields, 0).alias("user_id"),
        field_at(fields, 1).alias("item_id"),
        field_at(fields, 3).alias("event_type"),
        time_raw.alias("time_raw"),
        epoch_seconds_to_timestamp(time_raw).alias("event_time"),
        F.lit(None).cast("string").alias("session_id"),
        field_at(fields, 2).alias("category_id"),
        F.lit(None).cast("string").alias("category_code"),
        F.lit(None).cast("string").alias("brand"),
        F.lit(None).cast("string").alias("price_raw"),
        F.lit(None).cast("string").alias("title"),
    )
