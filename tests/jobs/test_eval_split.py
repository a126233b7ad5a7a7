"""Evaluation splits: no target event reaches the history, the right targets, the catalog as of the history."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from jobs.common.errors import HirError
from jobs.eval.split import last_conversion_split, temporal_split
from schemas.tables import ENTITIES, EVENTS

T0 = dt.datetime(2024, 5, 1, 8, 0)
CUTOFF = dt.datetime(2024, 5, 3, 0, 0, tzinfo=dt.UTC)


def at(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def ev(user, item, stage, hours):
    t = at(hours)
    return ("shop", user, item, stage, stage, t, None, t.date())


def ent(item, category, brand, hours):
    t = at(hours)
    return ("shop", "item", item, category, None, brand, 1.0, None, t, t.date())


def frame(spark, rows, spec):
    return spark.createDataFrame(pd.DataFrame(rows, columns=spec.schema.names), spec.schema)


def pairs(df) -> set[tuple[str, str]]:
    return {(r["user_id"], r["item_id"]) for r in df.collect()}


# Cut-off = 40 h after T0.
TEMPORAL_EVENTS = [
    ev("u1", "i1", "view", 1),
    ev("u1", "i2", "purchase", 41),  # after: target of u1 on an item never seen before
    ev("u1", "i2", "cart", 42),  # the same pair again: one target
    ev("u2", "i1", "cart", 45),  # u2 has no history: not evaluated
    ev("u3", "i1", "cart", 2),
    ev("u3", "i1", "purchase", 39.9),
    ev("u3", "i1", "purchase", 40.0),  # exactly at the cut-off: a target (repeat), not history
    ev("u3", "i3", "view", 50),  # a later view is neither history nor target
]
TEMPORAL_ENTITIES = [
    ent("i1", "c1", "old", 1),
    ent("i1", "c1", "rebrand", 45),  # attributes observed after the cut-off must not reach the history
    ent("i2", "c2", "acme", 41),  # first listed after the cut-off: a catalog-only item
    ent("i3", "c1", None, 50),
]


def test_temporal_history_stops_before_the_cutoff_and_targets_are_distinct_deep_pairs(spark):
    split = temporal_split(
        frame(spark, TEMPORAL_EVENTS, EVENTS), frame(spark, TEMPORAL_ENTITIES, ENTITIES), CUTOFF
    )
    history = split.history.collect()
    assert max(r["event_time"] for r in history) < at(40)
    assert pairs(split.history) == {("u1", "i1"), ("u3", "i1")}
    assert len(history) == 3
    assert pairs(split.targets) == {("u1", "i2"), ("u3", "i1")}
    assert split.history_ds == at(39.9).date()
    catalog = {r["entity_id"]: r for r in split.catalog.collect()}
    assert set(catalog) == {"i1", "i2", "i3"}
    assert catalog["i1"]["brand"] == "old"  # the latest row by the history's end, not the later rebrand
    assert catalog["i2"]["brand"] == "acme"  # new item: its first listing, moved to the history's day
    assert all(r["ds"] == split.history_ds and r["last_seen"] <= at(39.9) for r in catalog.values())


def test_temporal_cutoff_needs_a_zone(spark):
    with pytest.raises(HirError, match="time zone"):
        temporal_split(
            frame(spark, TEMPORAL_EVENTS, EVENTS),
            frame(spark, TEMPORAL_ENTITIES, ENTITIES),
            CUTOFF.replace(tzinfo=None),
        )


LLOO_EVENTS = [
    ev("u1", "a", "view", 1),
    ev("u1", "b", "cart", 2),
    ev("u1", "c", "view", 3),
    ev("u1", "d", "purchase", 4),  # u1's last conversion: the target
    ev("u1", "e", "view", 5),  # after it: removed
    ev("u2", "a", "view", 1),  # no conversion: all history, no target
    ev("u3", "a", "purchase", 1),  # only a conversion: no history, not evaluated
    ev("u4", "a", "view", 1),
    ev("u4", "x", "purchase", 2),
    ev("u4", "y", "cart", 2),  # same second as x: the larger item id is the target, both leave
]


def test_leave_last_conversion_out_removes_the_target_and_everything_after_it(spark):
    split = last_conversion_split(frame(spark, LLOO_EVENTS, EVENTS), frame(spark, [], ENTITIES))
    assert pairs(split.targets) == {("u1", "d"), ("u4", "y")}
    assert pairs(split.history) == {("u1", "a"), ("u1", "b"), ("u1", "c"), ("u2", "a"), ("u4", "a")}
    held = {"u1": at(4), "u4": at(2)}
    for r in split.history.collect():
        assert r["user_id"] not in held or r["event_time"] < held[r["user_id"]]
