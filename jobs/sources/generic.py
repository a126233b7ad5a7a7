"""Any event log, CSV or Parquet, described by a column mapping file (TOML). See conf/sources/generic_example.toml.

name = "shop"                 # value of events.source; a rerun replaces only this source's days
format = "csv"                # csv | parquet
# csv files must start with a header line naming the columns
delimiter = ","
timezone = "UTC"              # zone of the calendar day `ds`
time_format = "epoch_seconds" # epoch_seconds | epoch_millis | a Spark datetime pattern
numeric_ids = false           # require digits-only user/item/category ids

[columns]                     # canonical name = column in the file
user_id = "uid"
item_id = "sku"
event_type = "action"
event_time = "ts"
# optional: session_id, category_id, category_code, brand, price, title

[event_types]                 # raw event type = funnel stage (view, favourite, cart, purchase, removal)
click = "view"
order = "purchase"
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType
from pyspark.sql.utils import AnalysisException

from jobs.common.errors import HirError
from jobs.sources.canonical import MAX_EPOCH, MIN_EPOCH, SourceRules, blank_to_null, reject_reason
from jobs.sources.text import check_inputs, first_line, read_lines

REQUIRED = ("user_id", "item_id", "event_type", "event_time")
OPTIONAL = ("session_id", "category_id", "category_code", "brand", "price", "title")
_EXTRA = "__extra_field__"


@dataclass(frozen=True)
class Mapping:
    name: str
    format: str
    delimiter: str
    timezone: str
    time_format: str
    numeric_ids: bool
    columns: dict[str, str]
    event_types: dict[str, str]

    @property
    def rules(self) -> SourceRules:
        return SourceRules(
            name=self.name, stage_map=self.event_types, timezone=self.timezone, numeric_ids=self.numeric_ids
        )


def load_mapping(path: str | None) -> Mapping:
    """Parse and check a mapping file; every problem is a one-line HirError."""
    if not path:
        raise HirError("--mapping is required for --source generic (a TOML column mapping)")
    if not Path(path).is_file():
        raise HirError(f"mapping file not found: {path}")
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HirError(f"mapping file {path} is not valid TOML: {exc}") from None
    columns = raw.get("columns", {})
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise HirError(f"mapping file {path}: [columns] lacks {', '.join(missing)}")
    unknown = [c for c in columns if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise HirError(f"mapping file {path}: unknown canonical column '{unknown[0]}'")
    fmt = raw.get("format", "csv")
    if fmt not in ("csv", "parquet"):
        raise HirError(f"mapping file {path}: format must be csv or parquet, got '{fmt}'")
    if fmt == "csv" and not raw.get("header", True):
        raise HirError(f"mapping file {path}: csv input needs header = true (columns are mapped by name)")
    event_types = raw.get("event_types", {})
    if not event_types:
        raise HirError(f"mapping file {path}: [event_types] must map raw event types to funnel stages")
    mapping = Mapping(
        name=str(raw.get("name", "generic")),
        format=fmt,
        delimiter=str(raw.get("delimiter", ",")),
        timezone=str(raw.get("timezone", "UTC")),
        time_format=str(raw.get("time_format", "epoch_seconds")),
        numeric_ids=bool(raw.get("numeric_ids", False)),
        columns={k: str(v) for k, v in columns.items()},
        event_types={str(k): str(v) for k, v in event_types.items()},
    )
    try:
        reject_reason(mapping.rules)  # validates the funnel stages named in [event_types]
    except ValueError as exc:
        raise HirError(f"mapping file {path}: {exc}") from None
    return mapping


def _parse_time(raw: Column, time_format: str, timezone: str) -> Column:
    """Epoch numbers are instants; a pattern without a zone field is wall-clock time in the source's zone."""
    if time_format in ("epoch_seconds", "epoch_millis"):
        scale = 1 if time_format == "epoch_seconds" else 1000
        value = raw.try_cast("long")
        ok = raw.rlike(r"^[0-9]+$") & (value >= MIN_EPOCH * scale) & (value < MAX_EPOCH * scale)
        return F.when(ok, F.timestamp_seconds(value / scale))
    parsed = F.try_to_timestamp(raw, F.lit(time_format))
    unquoted = re.sub(r"'[^']*'", "", time_format)
    has_zone = re.search(r"[XxZzOV]", unquoted) or "'UTC'" in time_format
    return parsed if has_zone else F.to_utc_timestamp(parsed, timezone)


def _csv_frame(spark: SparkSession, paths: list[str], mapping: Mapping) -> DataFrame:
    header = first_line(spark, paths[0])
    if header is None:
        raise HirError(f"input {paths[0]} is empty: expected a header line")
    names = [n.strip() for n in header.split(mapping.delimiter)]
    missing = [c for c in mapping.columns.values() if c not in names]
    if missing:
        raise HirError(f"input {paths[0]}: column '{missing[0]}' named in the mapping is not in the header")
    lines = read_lines(spark, paths, header)
    schema = StructType([StructField(n, StringType()) for n in names] + [StructField(_EXTRA, StringType())])
    parsed = F.from_csv(
        F.col("record"), schema.simpleString(), {"sep": mapping.delimiter, "mode": "PERMISSIVE"}
    )
    frame = lines.withColumn("_p", parsed)
    structural = F.when(F.trim(F.col("record")) == "", F.lit("empty line")).when(
        F.col(f"_p.{_EXTRA}").isNotNull(), F.lit(f"too many fields: more than {len(names)}")
    )
    return frame.select(
        "input_file",
        "record",
        structural.alias("structural_reason"),
        *[F.col(f"_p.`{n}`").alias(n) for n in names],
    )


def _parquet_frame(spark: SparkSession, paths: list[str], mapping: Mapping) -> DataFrame:
    try:
        frame = spark.read.parquet(*paths)
    except AnalysisException as exc:
        raise HirError(f"cannot read parquet {', '.join(paths)}: {str(exc).splitlines()[0]}") from None
    missing = [c for c in mapping.columns.values() if c not in frame.columns]
    if missing:
        raise HirError(f"input {paths[0]}: column '{missing[0]}' named in the mapping is not in the file")
    data_cols = frame.columns
    return frame.select(
        F.col("_metadata.file_path").alias("input_file"),
        F.to_json(F.struct(*[F.col(c) for c in data_cols])).alias("record"),
        F.lit(None).cast("string").alias("structural_reason"),
        *[F.col(c).cast("string").alias(c) for c in data_cols],
    )


def stage(spark: SparkSession, paths: list[str], mapping: Mapping) -> DataFrame:
    check_inputs(paths)
    frame = (_csv_frame if mapping.format == "csv" else _parquet_frame)(spark, paths, mapping)

    def mapped(canonical: str) -> Column:
        source_col = mapping.columns.get(canonical)
        return blank_to_null(source_col) if source_col else F.lit(None).cast("string")

    time_raw = mapped("event_time")
    return frame.select(
        "input_file",
        "record",
        F.col("record").alias("dedup_key"),
        "structural_reason",
        mapped("user_id").alias("user_id"),
        mapped("item_id").alias("item_id"),
        mapped("event_type").alias("event_type"),
        time_raw.alias("time_raw"),
        _parse_time(time_raw, mapping.time_format, mapping.timezone).alias("event_time"),
        mapped("session_id").alias("session_id"),
        mapped("category_id").alias("category_id"),
        F.lower(mapped("category_code")).alias("category_code"),
        F.lower(mapped("brand")).alias("brand"),
        mapped("price").alias("price_raw"),
        mapped("title").alias("title"),
    )
