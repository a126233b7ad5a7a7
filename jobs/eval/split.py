"""Evaluation splits: what the models may see (history) and what they must predict (deep-funnel targets).

Two protocols, each leak-free by construction: the history handed to the pipeline holds no event at or after a
user's cut-off, so no stage (graph, samples, training, baselines) can see a target.

* temporal: one global cut-off instant. History = every event before it; targets = the distinct (user, item)
  cart/purchase pairs at or after it, for users with history. Fits logs that span days (Taobao: 9 days).
* leave_last_conversion_out: for each user with a cart or purchase, the target is the item of the user's last
  such event; that event and everything after it for that user leave every input. Fits short logs (REES46's
  slice covers three hours, too short for a global cut-off).

The catalog the models may score is every item the entity table knows, with its attributes as of the
history's end: items first seen after the cut-off are known by category, brand, price and text, never by
their interactions (a new ad is listed before anyone clicks it).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from jobs.common.errors import HirError
from schemas.codes import FUNNEL_STAGES

PROTOCOLS = ("temporal", "leave_last_conversion_out")
DEEP_STAGES = ("cart", "purchase")
USER_KEY = ("source", "user_id")
PAIR_KEY = ("source", "user_id", "item_id")


@dataclass(frozen=True)
class Split:
    """The inputs the models may use and the targets they are judged on."""

    protocol: str
    history: DataFrame  # events schema: the events before each user's cut-off
    catalog: (
        DataFrame  # entities schema, one row per item, attributes as of the history's end, ds = history_ds
    )
    targets: DataFrame  # (source, user_id, item_id): distinct deep-funnel pairs after the user's cut-off
    history_ds: dt.date  # last day in the history: the day the pipeline runs for
    cutoff: str  # human-readable description for the report


def funnel_events(events: DataFrame) -> DataFrame:
    """Events of the four funnel stages (removals carry no interest and are never targets)."""
    return events.where(F.col("funnel_stage").isin(list(FUNNEL_STAGES)))


def temporal_split(events: DataFrame, entities: DataFrame, cutoff: dt.datetime) -> Split:
    """History before `cutoff` (an aware datetime), targets the deep-funnel pairs at or after it."""
    if cutoff.tzinfo is None:
        raise HirError("the temporal cut-off needs a time zone, e.g. 2017-12-02T00:00:00+08:00")
    instant = F.lit(cutoff.astimezone(dt.UTC).replace(tzinfo=None)).cast("timestamp")
    history = events.where(F.col("event_time") < instant)
    later = funnel_events(events).where(F.col("event_time") >= instant)
    targets = (
        later.where(F.col("funnel_stage").isin(list(DEEP_STAGES)))
        .select(*PAIR_KEY)
        .distinct()
        .join(history.select(*USER_KEY).distinct(), list(USER_KEY), "left_semi")
    )
    return _finish("temporal", history, entities, targets, f"events before {cutoff.isoformat()}")


def last_conversion_split(events: DataFrame, entities: DataFrame) -> Split:
    """Each converting user's last cart/purchase is the target; it and everything after it leave the history.

    Ties (several deep events in the user's last second) resolve to the largest item id, so the split is
    deterministic; every event of that second leaves the history too.
    """
    deep = funnel_events(events).where(F.col("funnel_stage").isin(list(DEEP_STAGES)))
    last = deep.groupBy(*USER_KEY).agg(F.max(F.struct("event_time", "item_id")).alias("last"))
    held = last.select(*USER_KEY, F.col("last.event_time").alias("held_time"), F.col("last.item_id"))
    history = (
        events.join(held.select(*USER_KEY, "held_time"), list(USER_KEY), "left")
        .where(F.col("held_time").isNull() | (F.col("event_time") < F.col("held_time")))
        .drop("held_time")
    )
    targets = held.select(*PAIR_KEY).join(history.select(*USER_KEY).distinct(), list(USER_KEY), "left_semi")
    return _finish(
        "leave_last_conversion_out",
        history,
        entities,
        targets,
        "each converting user's last cart/purchase held out",
    )


def _finish(protocol: str, history: DataFrame, entities: DataFrame, targets: DataFrame, cutoff: str) -> Split:
    bounds = history.agg(F.max("ds").alias("ds"), F.max("event_time").alias("t")).first()
    if bounds is None or bounds["ds"] is None:
        raise HirError(f"{protocol}: no events before the cut-off: nothing to build the models from")
    return Split(
        protocol=protocol,
        history=history,
        catalog=catalog_snapshot(entities, bounds["ds"], bounds["t"]),
        targets=targets,
        history_ds=bounds["ds"],
        cutoff=cutoff,
    )


def catalog_snapshot(entities: DataFrame, history_ds: dt.date, as_of: dt.datetime) -> DataFrame:
    """One row per item: its latest attributes observed by `as_of`, else its first listing after it (an item
    new after the cut-off, known by its attributes only); dated `history_ds`, last_seen at most `as_of`."""
    as_of_col = F.lit(as_of).cast("timestamp")
    known = F.col("last_seen") <= as_of_col
    # Rows seen by as_of first, newest first; then later rows, earliest first.
    order = Window.partitionBy("source", "entity_type", "entity_id").orderBy(
        F.when(known, 0).otherwise(1),
        F.when(known, F.col("last_seen")).desc_nulls_last(),
        F.col("last_seen").asc(),
        F.col("ds").asc(),
    )
    return (
        entities.withColumn("_rank", F.row_number().over(order))
        .where("_rank = 1")
        .drop("_rank")
        .withColumn("last_seen", F.least(F.col("last_seen"), as_of_col))
        .withColumn("ds", F.lit(history_ds).cast("date"))
    )


def stage_weight(weights: dict[str, float]) -> Column:
    """The funnel-stage weight of an event (0 for removals)."""
    column = F.lit(0.0)
    for stage, weight in weights.items():
        column = F.when(F.col("funnel_stage") == stage, F.lit(float(weight))).otherwise(column)
    return column
