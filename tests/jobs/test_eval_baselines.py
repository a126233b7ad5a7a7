"""Baselines on tiny histories whose rankings are worked out by hand."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest

from jobs.eval import baselines as bl
from schemas.tables import EVENTS

T = dt.datetime(2024, 5, 1, 8, 0)


def ev(user, item, stage, minute=0):
    t = T + dt.timedelta(minutes=minute)
    return ("shop", user, item, stage, stage, t, None, t.date())


def history(spark, rows):
    return spark.createDataFrame(pd.DataFrame(rows, columns=EVENTS.schema.names), EVENTS.schema)


def node(kind: str, raw: str, spark) -> int:
    df = spark.createDataFrame(pd.DataFrame({"source": ["shop"], "x": [raw]}))
    return df.select(bl.node_id(df["source"], bl.F.lit(kind), df["x"]).alias("n")).first()["n"]


@pytest.fixture(scope="module")
def ids(spark):
    users = {u: node("user", u, spark) for u in ("u1", "u2", "u3", "u4")}
    items = {i: node("item", i, spark) for i in ("a", "b", "c", "d", "n")}
    return users, items


def frame_of(spark, column: str, values) -> object:
    return spark.createDataFrame(pd.DataFrame({column: np.asarray(list(values), dtype=np.int64)}))


def ranked(df, users) -> dict[str, list]:
    by_node = {v: k for k, v in users.items()}
    out: dict[str, list] = {}
    for r in df.orderBy("user", "rank").collect():
        out.setdefault(by_node[r["user"]], []).append(r["item"])
    return out


ROWS = [
    ev("u1", "a", "view"),
    ev("u1", "a", "purchase", 1),
    ev("u1", "b", "view", 2),
    ev("u2", "a", "view"),
    ev("u2", "c", "cart", 1),
    ev("u2", "c", "removal", 2),  # removals carry no interest
    ev("u3", "b", "view"),
    ev("u3", "d", "view", 1),
]


def test_interactions_weigh_stages_and_count_conversions(spark, ids):
    users, items = ids
    ui = {(r["user"], r["item"]): r for r in bl.interactions(history(spark, ROWS)).collect()}
    assert ui[(users["u1"], items["a"])]["weight"] == 1.0 + 5.0 and ui[(users["u1"], items["a"])]["deep"] == 1
    assert ui[(users["u2"], items["c"])]["weight"] == 3.0 and ui[(users["u2"], items["c"])]["events"] == 1
    assert len(ui) == 6


def test_popularity_ranks_by_conversions_then_engagement_within_the_candidates(spark, ids):
    users, items = ids
    ui = bl.interactions(history(spark, ROWS))
    pool = frame_of(spark, "item", [items[i] for i in "abcd"])
    out = ranked(bl.popularity(ui, frame_of(spark, "user", [users["u4"]]), pool, 3), users)
    # a: 1 conversion (weight 7), c: 1 conversion (weight 3), then b (2 views) before d (1 view).
    assert out == {"u4": [items["a"], items["c"], items["b"]]}
    without_a = frame_of(spark, "item", [items[i] for i in "bcd"])
    assert ranked(bl.popularity(ui, frame_of(spark, "user", [users["u4"]]), without_a, 2), users) == {
        "u4": [items["c"], items["b"]]
    }


def test_co_visitation_scores_items_that_share_users_with_the_users_items(spark, ids):
    users, items = ids
    ui = bl.interactions(history(spark, ROWS))
    pool = frame_of(spark, "item", [items[i] for i in "abcd"])
    got = {
        (r["user"], r["item"]): r["rank"]
        for r in bl.co_visitation(ui, frame_of(spark, "user", [users["u3"]]), pool, 10).collect()
    }
    # u3 saw b (1) and d (1). Vectors over users: a=(u1 6, u2 1), b=(u1 1, u3 1), c=(u2 3), d=(u3 1).
    # cos(b, d) = 1/sqrt(2); cos(b, a) = 6/(sqrt(2) sqrt(37)); c shares no user with b or d.
    # score(b) = 1 (self) + cos(d, b) = 1.707, score(d) = 1.707 (tie: smaller node id first), score(a) = 0.697.
    scores = {"a": 6 / (math.sqrt(2) * math.sqrt(37)), "b": 1 + 1 / math.sqrt(2), "d": 1 + 1 / math.sqrt(2)}
    expected = sorted(scores, key=lambda i: (-round(scores[i], 9), items[i]))
    assert [i for i in expected] == [
        i for i, _ in sorted(((i, got[(users["u3"], items[i])]) for i in scores), key=lambda p: p[1])
    ]
    assert (users["u3"], items["c"]) not in got


def test_category_popularity_scores_new_items_by_the_users_categories_and_brands(spark, ids):
    users, items = ids
    ui = bl.interactions(history(spark, ROWS))
    attrs = spark.createDataFrame(
        pd.DataFrame(
            {
                "item": [items[i] for i in "abcdn"],
                "category": ["k1", "k2", "k1", "k2", "k1"],
                "brand": ["acme", None, None, None, "acme"],
            }
        )
    )
    pool = frame_of(spark, "item", [items[i] for i in "abcdn"])
    got = bl.category_popularity(ui, frame_of(spark, "user", [users["u1"]]), pool, attrs, 10).collect()
    order = [r["item"] for r in sorted(got, key=lambda r: r["rank"])]
    # u1: A(k1) = 6 (item a), A(acme) = 6, A(k2) = 1 (item b). Popularity weights: a 7, b 2, c 3, d 1, n 0.
    score = {
        "a": (6 + 6) * (1 + math.log1p(7)),
        "n": (6 + 6) * 1.0,  # a new item of u1's category and brand, no history at all
        "c": 6 * (1 + math.log1p(3)),
        "b": 1 * (1 + math.log1p(2)),
        "d": 1 * (1 + math.log1p(1)),
    }
    assert order == [items[i] for i in sorted(score, key=lambda i: -score[i])]


def test_als_recommends_the_users_block_and_tuning_keeps_the_best_grid_point(spark):
    # Two blocks of users and items: users of block 0 only touch items 0-4, block 1 items 5-9; each user
    # misses one item of its block, which ALS should rank above every item of the other block.
    rows = [
        ev(f"u{u}", f"i{i}", "view", minute=i)
        for u in range(12)
        for i in range(10)
        if (i < 5) == (u < 6) and i != (u % 5) + (0 if u < 6 else 5)
    ]
    ui = bl.interactions(history(spark, rows)).cache()
    pool = ui.select("item").distinct()
    users = ui.select("user").distinct()
    fitted = bl.als_fit(ui, {"rank": 4, "regParam": 0.01, "alpha": 10.0})
    recs = bl.als_rank(fitted, users, pool, 5).collect()
    user_block = {r["user"]: r["block"] for r in _block_rows(ui, "user")}
    item_block = {r["item"]: r["block"] for r in _block_rows(ui, "item")}
    in_block = [item_block[r["item"]] == user_block[r["user"]] for r in recs if r["rank"] == 1]
    assert len(in_block) == 12 and all(in_block)
    calls = []

    def score(ranking):
        calls.append(ranking.count())
        return float(len(calls) == 2)  # the second grid point scores best

    choice = bl.tune_als(
        ui, users, pool, score, 5, grid={"rank": (2, 3), "regParam": (0.1,), "alpha": (1.0,)}
    )
    assert choice.params == {"rank": 3, "regParam": 0.1, "alpha": 1.0} and len(choice.grid) == 2
    assert calls == [60, 60]  # 12 users x top 5


def _block_rows(ui, column):
    """Block of each user/item from the pairs: users sharing items are in the same block."""
    pairs = [(r["user"], r["item"]) for r in ui.collect()]
    anchor_items = {i for u, i in pairs if u == pairs[0][0]}
    users_0 = {u for u, i in pairs if i in anchor_items}
    items_0 = {i for u, i in pairs if u in users_0}
    key = users_0 if column == "user" else items_0
    values = {u for u, _ in pairs} if column == "user" else {i for _, i in pairs}
    return [{column: v, "block": int(v in key)} for v in values]


def test_weighted_profiles_average_the_item_vectors_by_engagement():
    vectors = {1: np.array([1.0, 0.0], np.float32), 2: np.array([0.0, 1.0], np.float32)}
    profiles = bl.weighted_profiles(
        np.array([10, 10, 11]),
        np.array([1, 2, 9]),
        np.array([3.0, 1.0, 5.0]),
        np.array([10, 11, 12]),
        vectors,
    )
    assert np.allclose(profiles[0], np.array([3.0, 1.0]) / math.sqrt(10))
    assert np.allclose(profiles[1], 0) and np.allclose(profiles[2], 0)  # no known item / no history
