"""The training job's Spark side of the next-period objective: the cut-off, the input rows, the positives.

Inside the day's window (what the day's graph covers) a training cut-off splits the events in two:

* before it: the **input graph**, built and sampled by the same code as the day's (jobs.build_graph,
  jobs.sample_neighbourhoods) for users and items, as of the cut-off's day: both ends of every pair and every
  negative are read from it (hir_model.pairs), as `embed` reads the day's graph;
* from it to the end of the day: the **positives**, each distinct (user, item) engagement of any funnel stage
  with the loss weight of its deepest stage (default build_graph's: purchase 5, cart 3, favourite 2, view 1).

The end of the positives' period is held out by time to choose the stopping epoch (hir_model.selection): a
**validation cut-off** leaves the last `validation_share` of the period's funnel events after it; the positives
before it train, those from it on validate, for every user, with the users' and items' rows sampled again from the
events before it. That is the served case: a model trained on a user's recent engagements predicts the user's next
ones from the user's whole history. (Users held out whole measured a model's reach to users it never trained on,
not what it serves: on Taobao it ranked a warm start above a cold start that the next day's conversions ranked far
above it, the cold start's lead being the trained users' repeats.)

With `periods` N > 1 the window also gives up to N - 1 **earlier periods** before the cut-off, each as long in
funnel events as the next period, latest first: each period's engagements are predicted from the rows of a graph
built from the events before its own start. A user then trains from several points of its history, as a sequence
model learns from every position of a sequence instead of its last; the validation stays the next period's end.

The default cut-off leaves the last `share` of the window's funnel events after it, so it works on logs that
span days (Taobao: a day and a half of positives) and on logs of hours (REES46: cut inside the day). Only events
up to the day's end are read: nothing after ds reaches training.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from hir_model.data import NEIGHBOURHOOD_COLUMNS, NeighbourhoodRows, arrow_columns
from jobs.build_graph import GraphConfig, cap_degree, graph_edges, graph_nodes, node_id
from jobs.common.delta import read_table, table_path, table_version
from jobs.common.errors import HirError
from jobs.eval.split import stage_weight
from jobs.sample_neighbourhoods import SampleConfig, sample_neighbourhoods
from schemas.codes import FUNNEL_STAGES
from schemas.tables import ENTITIES, EVENTS

_BUILT: dict[tuple, NextPeriod] = {}  # next_period's per-process memo
_KEEP = 4


@dataclass(frozen=True)
class HeldOut:
    """The end of the next period, held out to choose the stopping epoch: engagements at or after `cutoff`, and
    the users' and items' rows sampled from the events before it."""

    cutoff: dt.datetime  # naive UTC
    inputs: NeighbourhoodRows
    user_ids: np.ndarray  # (V,) one per (user, item, stage)
    item_ids: np.ndarray
    weights: np.ndarray  # (V,) stage weight


@dataclass(frozen=True)
class EarlierPeriod:
    """A period before the next one, as long in funnel events: its engagements (at or after `cutoff`, before the
    next period's start) and the users' and items' rows sampled from the events before `cutoff`."""

    cutoff: dt.datetime  # naive UTC
    inputs: NeighbourhoodRows
    user_ids: np.ndarray  # (P,) one per (user, item, stage)
    item_ids: np.ndarray
    weights: np.ndarray  # (P,) stage weight


@dataclass(frozen=True)
class NextPeriod:
    """What the trainer needs from Spark for the next-period objective."""

    cutoff: dt.datetime  # naive UTC instant: input events are before it, positives at or after it
    inputs: NeighbourhoodRows  # users' and items' rows sampled from the events before the cut-off
    user_ids: (
        np.ndarray
    )  # (P,) training positives, one per (user, item, stage), before any validation cut-off
    item_ids: np.ndarray
    weights: np.ndarray  # (P,) stage weight
    lineage: dict
    validation: HeldOut | None = None  # None: nothing held out (share 0, or the period has one instant)
    # Latest first: more positives from the same window (hir train --train-periods); () for the next period alone.
    earlier: tuple[EarlierPeriod, ...] = ()


def parse_cutoff(value: str) -> dt.datetime | None:
    """`auto` (None) or an ISO instant with a zone, as a naive UTC datetime."""
    if value == "auto":
        return None
    try:
        instant = dt.datetime.fromisoformat(value)
    except ValueError:
        raise HirError(f"--train-cutoff: '{value}' is not 'auto' or an ISO date-time") from None
    if instant.tzinfo is None:
        raise HirError(f"--train-cutoff: '{value}' needs a time zone, e.g. 2017-12-01T00:00:00+08:00")
    return instant.astimezone(dt.UTC).replace(tzinfo=None)


def window_events(spark: SparkSession, warehouse: str, ds: dt.date, lookback_days: int) -> DataFrame:
    """The funnel events of the day's graph window [ds - lookback, ds]."""
    events = read_table(spark, EVENTS, warehouse)
    start = ds - dt.timedelta(days=lookback_days)
    return events.where(F.col("ds").between(F.lit(start), F.lit(ds))).where(
        F.col("funnel_stage").isin(list(FUNNEL_STAGES))
    )


def auto_cutoff(events: DataFrame, share: float) -> dt.datetime:
    """The instant with `share` of the window's funnel events at or after it: the exact quantile, since an
    approximate one (GK sketches merged per partition) moves with the table's file layout, and with it the
    training data: the same events written by another number of tasks trained another model."""
    micros = events.select(F.unix_micros(F.col("event_time")).alias("t"))
    quantile = micros.agg(F.percentile(F.col("t"), F.lit(1.0 - share))).first()[0]
    if quantile is None:
        raise HirError("no funnel events in the day's window: nothing to train on")
    return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(quantile))


def next_period(
    spark: SparkSession,
    warehouse: str,
    ds: dt.date,
    cutoff: dt.datetime | None,
    share: float,
    positive_weights: Mapping[str, float],
    sample: SampleConfig,
    max_tokens: int,
    validation_share: float = 0.0,
    periods: int = 1,
) -> NextPeriod:
    """Cut-off, the users' input rows before it and the positives after it, the last `validation_share` of them
    held out (see the module docstring).

    Kept per process for the same tables, versions and settings: an evaluation trains the model and its
    ablations on one history, and builds these inputs once for all of them."""
    key = (
        table_path(warehouse, EVENTS),
        table_version(spark, EVENTS, warehouse),
        table_version(spark, ENTITIES, warehouse),
        ds,
        cutoff,
        share,
        tuple(sorted(positive_weights.items())),
        (sample.k1, sample.k2, sample.user_k1, sample.seed, sample.salts),
        max_tokens,
        validation_share,
        periods,
    )
    if key in _BUILT:
        return _BUILT[key]
    if len(_BUILT) >= _KEEP:
        _BUILT.clear()
    graph = GraphConfig(ds=ds, warehouse=warehouse)
    events = window_events(spark, warehouse, ds, graph.lookback_days)
    rule = "given" if cutoff is not None else f"last {share:.0%} of the window's funnel events after it"
    cutoff = cutoff or auto_cutoff(events, share)
    instant = F.lit(cutoff).cast("timestamp")
    before = events.where(F.col("event_time") < instant)
    after = events.where(F.col("event_time") >= instant)
    if before.limit(1).count() == 0 or after.limit(1).count() == 0:
        raise HirError(
            f"training cut-off {cutoff.isoformat()}Z leaves no events before or after it in the window of {ds}"
        )
    entities = read_table(spark, ENTITIES, warehouse)
    inputs = input_rows(before, entities, cutoff.date(), warehouse, sample, max_tokens)

    held_out, trained, validation_by_stage = None, after, {}
    validation_cutoff = auto_cutoff(after, validation_share) if validation_share > 0 else None
    if validation_cutoff is not None:
        split = F.lit(validation_cutoff).cast("timestamp")
        trained, late = after.where(F.col("event_time") < split), after.where(F.col("event_time") >= split)
        if trained.limit(1).count() == 0:  # the whole period is one instant: nothing left to train on
            trained, validation_cutoff = after, None
        else:
            *engaged, validation_by_stage = engagements(late, positive_weights)
            held_out = HeldOut(
                validation_cutoff,
                input_rows(
                    events.where(F.col("event_time") < split),
                    entities,
                    validation_cutoff.date(),
                    warehouse,
                    sample,
                    max_tokens,
                ),
                *engaged,
            )
    user_ids, item_ids, weights, by_stage = engagements(trained, positive_weights)
    earlier = earlier_periods(
        events, entities, cutoff, periods - 1, positive_weights, warehouse, sample, max_tokens
    )
    lineage = {
        "cutoff": cutoff.isoformat() + "Z",
        "cutoff_rule": rule,
        "events_version": table_version(spark, EVENTS, warehouse),
        "entities_version": table_version(spark, ENTITIES, warehouse),
        "input_users": int((inputs.node_type == "user").sum()),
        "input_items": int((inputs.node_type == "item").sum()),
        "positives_by_stage": by_stage,
        "validation_cutoff": validation_cutoff.isoformat() + "Z" if validation_cutoff else None,
        "validation_share": validation_share,
        "validation_by_stage": validation_by_stage,
    }
    if periods > 1:
        lineage["earlier_periods"] = [
            {
                "cutoff": p.cutoff.isoformat() + "Z",
                "positives": len(p.user_ids),
                "input_users": int((p.inputs.node_type == "user").sum()),
            }
            for p in earlier
        ]
    _BUILT[key] = NextPeriod(cutoff, inputs, user_ids, item_ids, weights, lineage, held_out, tuple(earlier))
    return _BUILT[key]


def earlier_periods(
    events: DataFrame,
    entities: DataFrame,
    cutoff: dt.datetime,
    count: int,
    positive_weights: Mapping[str, float],
    warehouse: str,
    sample: SampleConfig,
    max_tokens: int,
) -> list[EarlierPeriod]:
    """Up to `count` periods before `cutoff`, latest first, each holding as many funnel events as the window
    holds from `cutoff` on, and each predicted from the graph of the events before its own start: the positives
    of a sequence model that learns from every position of a history, not only its end. Stops early when the
    window runs out of events (the first period must leave some history before it)."""
    out: list[EarlierPeriod] = []
    if count < 1:  # the default: no Spark job at all
        return out
    length = events.where(F.col("event_time") >= F.lit(cutoff).cast("timestamp")).count()
    end = cutoff
    for _ in range(count):
        before = events.where(F.col("event_time") < F.lit(end).cast("timestamp"))
        available = before.count()
        if available <= length:
            break
        start = auto_cutoff(before, length / available)
        period_events = before.where(F.col("event_time") >= F.lit(start).cast("timestamp"))
        history = before.where(F.col("event_time") < F.lit(start).cast("timestamp"))
        if history.limit(1).count() == 0:
            break
        inputs = input_rows(history, entities, start.date(), warehouse, sample, max_tokens)
        user_ids, item_ids, weights, _ = engagements(period_events, positive_weights)
        out.append(EarlierPeriod(start, inputs, user_ids, item_ids, weights))
        end = start
    return out


def input_rows(
    before: DataFrame,
    entities: DataFrame,
    day: dt.date,
    warehouse: str,
    sample: SampleConfig,
    max_tokens: int,
) -> NeighbourhoodRows:
    """The users' and items' neighbourhood rows of a graph built from the events `before` an instant, as of its
    `day`, by the day's own code and settings (jobs.build_graph, jobs.sample_neighbourhoods)."""
    graph = GraphConfig(ds=day, warehouse=warehouse)
    # Computed once: the nodes, the user budget and both hops of the sample read it (as build_graph persists
    # the day's edges), instead of replaying the events' aggregation for each.
    edges = graph_edges(before, entities, graph).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        sampled = sample_neighbourhoods(
            graph_nodes(edges),
            cap_degree(edges, graph),
            dataclasses.replace(
                sample, ds=day, warehouse=warehouse, node_types=("user", "item"), max_tokens=max_tokens
            ),
        )
        return NeighbourhoodRows.from_columns(arrow_columns(sampled.toArrow(), NEIGHBOURHOOD_COLUMNS))
    finally:
        edges.unpersist()


def engagements(
    events: DataFrame, positive_weights: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """(user ids, item ids, stage weights, count per stage): the events' distinct (user, item, stage)."""
    positives = (
        events.select(
            node_id(F.col("source"), F.lit("user"), F.col("user_id")).alias("user"),
            node_id(F.col("source"), F.lit("item"), F.col("item_id")).alias("item"),
            stage_weight(positive_weights).alias("weight"),
            "funnel_stage",
        )
        .groupBy("user", "item", "funnel_stage")
        .agg(F.max("weight").alias("weight"))
        .toPandas()
    )
    by_stage = positives.groupby("funnel_stage").size().to_dict() if len(positives) else {}
    return (
        positives["user"].to_numpy(dtype=np.int64),
        positives["item"].to_numpy(dtype=np.int64),
        positives["weight"].to_numpy(dtype=np.float32),
        {k: int(v) for k, v in sorted(by_stage.items())},
    )
