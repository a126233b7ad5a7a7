"""Validation and canonicalisation shared by every source adapter."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.codes import ALL_STAGES

# Columns every adapter's staged frame carries (strings unless noted).
STAGED_COLUMNS = (
    "input_file",
    "record",
    "dedup_key",
    "structural_reason",
    "user_id",
    "item_id",
    "event_type",
    "time_raw",
    "event_time",  # timestamp, null when time_raw did not parse
    "session_id",
    "category_id",
    "category_code",
    "brand",
    "price_raw",
    "title",
)

ATTRIBUTE_COLUMNS = ("category_id", "category_code", "brand", "price", "title")

_NUMERIC = r"^[0-9]+$"
_DECIMAL = r"^-?[0-9]+(\.[0-9]+)?$"
# Epoch seconds outside [1990, 2100) are corrupt rather than old or future events.
MIN_EPOCH, MAX_EPOCH = 631152000, 4102444800


@dataclass(frozen=True)
class SourceRules:
    """How a source's staged strings become canonical events."""

    name: str
    stage_map: dict[str, str]
    timezone: str
    numeric_ids: bool = True
    required: tuple[str, ...] = ("user_id", "item_id", "event_type")
    extra_checks: tuple[tuple[Column, Column], ...] = field(default_factory=tuple)


def blank_to_null(column: str) -> Column:
    trimmed = F.trim(F.col(column))
    return F.when(trimmed == "", F.lit(None)).otherwise(trimmed)


def _quoted(column: str) -> Column:
    return F.concat(F.lit("'"), F.substring(F.coalesce(F.col(column), F.lit("")), 1, 60), F.lit("'"))


def reject_reason(rules: SourceRules) -> Column:
    """First failing check as a readable reason, null when the record is valid."""
    for stage in rules.stage_map.values():
        if stage not in ALL_STAGES:
            raise ValueError(f"source {rules.name}: unknown funnel stage '{stage}'")
    checks: list[tuple[Column, Column]] = [
        (F.col("structural_reason").isNotNull(), F.col("structural_reason"))
    ]
    for column in rules.required:
        checks.append((F.col(column).isNull(), F.lit(f"missing {column}")))
    if rules.numeric_ids:
        for column in ("user_id", "item_id"):
            checks.append(
                (~F.col(column).rlike(_NUMERIC), F.concat(F.lit(f"non-numeric {column} "), _quoted(column)))
            )
        checks.append(
            (
                F.col("category_id").isNotNull() & ~F.col("category_id").rlike(_NUMERIC),
                F.concat(F.lit("non-numeric category_id "), _quoted("category_id")),
            )
        )
    known = F.lit(list(rules.stage_map)) if rules.stage_map else F.array()
    checks.append(
        (
            ~F.array_contains(known, F.col("event_type")),
            F.concat(F.lit("unknown event type "), _quoted("event_type")),
        )
    )
    checks.append((F.col("event_time").isNull(), F.concat(F.lit("bad timestamp "), _quoted("time_raw"))))
    checks.append(
        (
            F.col("price_raw").isNotNull() & ~F.col("price_raw").rlike(_DECIMAL),
            F.concat(F.lit("non-numeric price "), _quoted("price_raw")),
        )
    )
    checks.extend(rules.extra_checks)
    reason = F.lit(None).cast("string")
    for failed, message in reversed(checks):
        reason = F.when(failed, message).otherwise(reason)
    return reason


def canonicalize(staged: DataFrame, rules: SourceRules) -> DataFrame:
    """Add `reason`, `source`, `funnel_stage`, `price`, `ds` to a staged frame."""
    stage_of = F.create_map(*[F.lit(x) for kv in sorted(rules.stage_map.items()) for x in kv])
    price = F.col("price_raw").try_cast("double")
    return (
        staged.withColumn("reason", reject_reason(rules))
        .withColumn("source", F.lit(rules.name))
        .withColumn("funnel_stage", stage_of[F.col("event_type")])
        # A price of 0 or below means 'unknown' in these logs (REES46 has 19 such rows), not a free item.
        .withColumn("price", F.when(price > 0, price))
        .withColumn("ds", F.to_date(F.from_utc_timestamp(F.col("event_time"), rules.timezone)))
    )


def split_fields(value: Column, sep: str, expected: int, what: str) -> tuple[Column, Column]:
    """Split an unquoted delimited line; return (fields array, structural reason or null)."""
    fields = F.split(value, sep, -1)
    reason = F.when(
        F.size(fields) != expected,
        F.concat(F.lit(f"{what}: "), F.size(fields).cast("string"), F.lit(f" of {expected} fields")),
    )
    return fields, reason


def field_at(fields: Column, index: int) -> Column:
    """Field `index` of a split line, trimmed, null when blank or absent."""
    value = F.trim(F.get(fields, index))  # get(): null, not an ANSI error, past the end
    return F.when(value != "", value)


def epoch_seconds_to_timestamp(raw: Column) -> Column:
    secs = raw.try_cast("long")
    ok = raw.rlike(_NUMERIC) & (secs >= MIN_EPOCH) & (secs < MAX_EPOCH)
    return F.when(ok, F.timestamp_seconds(secs))
