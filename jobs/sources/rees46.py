"""REES46 multi-category store (2019-Oct.csv): event_time,event_type,product_id,category_id,category_code,brand,
price,user_id,user_session. Times are 'YYYY-MM-DD HH:MM:SS UTC'; days are UTC. Has brands (advertisers), a
dot-separated category taxonomy and prices.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.sources.canonical import SourceRules, field_at, split_fields
from jobs.sources.text import read_lines

HEADER = "event_time,event_type,product_id,category_id,category_code,brand,price,user_id,user_session"
TIME_FORMAT = "yyyy-MM-dd HH:mm:ss 'UTC'"
RULES = SourceRules(
    name="rees46",
    stage_map={"view": "view", "cart": "cart", "purchase": "purchase", "remove_from_cart": "removal"},
    timezone="UTC",
)


def stage(spark: SparkSession, paths: list[str]) -> DataFrame:
    lines = read_lines(spark, paths, HEADER)
    fields, structural = split_fields(F.col("record"), ",", 9, "truncated or malformed line")

    return lines.select(
        "input_file",
        "record",
        F.col("record").alias("dedup_key"),
        structural.alias("structural_reason"),
        field_at(fields, 7).alias("user_id"),
        field_at(fields, 2).alias("item_id"),
        field_at(fields, 1).alias("event_type"),
        field_at(fields, 0).alias("time_raw"),
        F.try_to_timestamp(field_at(fields, 0), F.lit(TIME_FORMAT)).alias("event_time"),
        field_at(fields, 8).alias("session_id"),
        field_at(fields, 3).alias("category_id"),
        F.lower(field_at(fields, 4)).alias("category_code"),
        F.lower(field_at(fields, 5)).alias("brand"),
        field_at(fields, 6).alias("price_raw"),
        F.lit(None).cast("string").alias("title"),
    )
