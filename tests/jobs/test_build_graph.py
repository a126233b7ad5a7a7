"""build-graph: edges and weights on a hand-built day, reverse edges, stable ids, no leakage, degree cap, job."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest
from chispa import assert_approx_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobs import build_graph
from jobs.build_graph import (
    GraphConfig,
    cap_degree,
    graph_edges,
    graph_nodes,
    node_stats,
    recency_bucket,
)
from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from schemas.tables import EDGES, ENTITIES, EVENTS, NODES

D = dt.date(2024, 3, 10)


def frame(spark, rows, schema):
    """A DataFrame of inline rows, through Arrow: no Python worker tasks, several times faster to run."""
    return spark.createDataFrame(pd.DataFrame(rows, columns=schema.names), schema)


def day(offset: int) -> dt.date:
    return D + dt.timedelta(days=offset)


def at(offset: int, hour: int) -> dt.datetime:
    d = day(offset)
    return dt.datetime(d.year, d.month, d.day, hour)


def event(user, item, stage, offset, hour, source="shop"):
    return (source, user, item, stage, stage, at(offset, hour), None, day(offset))


EVENT_ROWS = [
    event("u1", "i1", "view", 0, 10),
    event("u1", "i1", "view", -7, 9),  # one half-life ago: weighs 0.5
    event("u1", "i1", "purchase", 0, 11),
    event("u1", "i1", "removal", 0, 12),  # kept in events, ignored by the graph
    event("u2", "i2", "favourite", -1, 8),
    event("u2", "i1", "cart", -3, 8),
    event("u3", "i2", "view", 1, 8),  # the day after ds: must not leak
    event("u4", "i3", "view", -40, 8),  # before the 30-day window
    event("u1", "i1", "view", 0, 9, source="other"),  # same raw ids in another source: other nodes
]
ENTITY_ROWS = [
    ("shop", "item", "i1", "10", "kitchen.mixer", "acme", 9.5, None, at(-7, 9), day(-7)),
    ("shop", "item", "i1", "10", "kitchen.mixer", "acme", 9.5, None, at(0, 11), day(0)),
    ("shop", "item", "i2", "20", None, None, 3.0, None, at(-1, 8), day(-1)),
    ("shop", "item", "i2", "20", None, "later", 3.0, None, at(1, 8), day(1)),  # brand seen after ds
    ("shop", "item", "i3", "30", None, None, 1.0, None, at(-40, 8), day(-40)),
]

HALF = 0.5 ** (1 / 7)  # one day of decay with the default 7-day half-life
I1 = 1.5 + 5.0 + 3 * HALF**3  # every event of item i1, stage-weighted and decayed
I2 = 2 * HALF
EDGE_SCHEMA = StructType(
    [
        StructField(name, StringType())
        for name in ("src_type", "src_raw", "dst_type", "dst_raw", "edge_type", "funnel")
    ]
    + [
        StructField("weight", DoubleType()),
        StructField("event_count", LongType()),
        StructField("first_time", TimestampType()),
        StructField("last_time", TimestampType()),
        StructField("recency_bucket", IntegerType()),
    ]
)


@pytest.fixture(scope="module")
def inputs(spark):
    return frame(spark, EVENT_ROWS, EVENTS.schema), frame(spark, ENTITY_ROWS, ENTITIES.schema)


@pytest.fixture(scope="module")
def day_graph(spark, inputs):
    """The pre-cap edges of ds = D, collected once for the tests that read them."""
    events, entities = inputs
    edges = graph_edges(events, entities, GraphConfig(ds=D))
    return edges.drop("weight_units", "last_ds").collect()


def test_expected_edges_weights_and_reverse_edges(spark, day_graph):
    def both(src, dst, forward, backward, funnel, weight, count, first, last, recency):
        values = (funnel, weight, count, first, last, recency)
        return [(*src, *dst, forward, *values), (*dst, *src, backward, *values)]

    u1, u2, i1, i2 = ("user", "u1"), ("user", "u2"), ("item", "i1"), ("item", "i2")
    leaf, mixer, kitchen, leaf2 = (("category", c) for c in ("10", "kitchen.mixer", "kitchen", "20"))
    i1_activity = (I1, 4, at(-7, 9), at(0, 11), 0)
    expected = [
        *both(u1, i1, "user_view_item", "item_viewed_by_user", "upper", 1.5, 2, at(-7, 9), at(0, 10), 0),
        *both(
            u1, i1, "user_purchase_item", "item_purchased_by_user", "deep", 5.0, 1, at(0, 11), at(0, 11), 0
        ),
        *both(
            u2, i2, "user_favourite_item", "item_favourited_by_user", "upper", I2, 1, at(-1, 8), at(-1, 8), 1
        ),
        *both(
            u2, i1, "user_cart_item", "item_carted_by_user", "deep", 3 * HALF**3, 1, at(-3, 8), at(-3, 8), 3
        ),
        *both(i1, leaf, "item_in_category", "category_has_item", "attribute", *i1_activity),
        *both(
            i1, ("advertiser", "acme"), "item_of_advertiser", "advertiser_has_item", "attribute", *i1_activity
        ),
        *both(leaf, mixer, "category_child_of", "category_parent_of", "attribute", *i1_activity),
        *both(mixer, kitchen, "category_child_of", "category_parent_of", "attribute", *i1_activity),
        *both(
            i2, leaf2, "item_in_category", "category_has_item", "attribute", I2, 1, at(-1, 8), at(-1, 8), 1
        ),
    ]
    shop = [tuple(r[c] for c in EDGE_SCHEMA.names) for r in day_graph if r["source"] == "shop"]
    assert_approx_df_equality(
        frame(spark, shop, EDGE_SCHEMA),
        frame(spark, expected, EDGE_SCHEMA),
        1e-9,
        ignore_row_order=True,
    )


def test_catalog_item_without_interactions_gets_attribute_edges_only(spark, inputs):
    # A new ad: in the catalog on ds (category, brand), nobody has interacted with it yet.
    events, entities = inputs
    new_ad = ("shop", "item", "ad9", "10", "kitchen.mixer", "newco", 20.0, None, at(0, 6), day(0))
    later = ("shop", "item", "ad10", "10", None, "late", 1.0, None, at(1, 6), day(1))  # listed after ds
    with_catalog = entities.unionByName(frame(spark, [new_ad, later], ENTITIES.schema))
    edges = graph_edges(events, with_catalog, GraphConfig(ds=D)).where(F.col("source") == "shop")
    touching = {
        (r["src_raw"], r["dst_raw"], r["edge_type"]): r
        for r in edges.collect()
        if "ad9" in (r["src_raw"], r["dst_raw"]) or "ad10" in (r["src_raw"], r["dst_raw"])
    }
    assert set(touching) == {
        ("ad9", "10", "item_in_category"),
        ("10", "ad9", "category_has_item"),
        ("ad9", "newco", "item_of_advertiser"),
        ("newco", "ad9", "advertiser_has_item"),
    }
    for r in touching.values():
        assert (r["weight_units"], r["event_count"], r["funnel"]) == (1, 0, "attribute")
        assert r["first_time"] == r["last_time"] == at(0, 6) and r["recency_bucket"] == 0
    # The category chain and i1's edges keep their weights: the new item adds one unit to its category only.
    chain = {
        (r["src_raw"], r["dst_raw"]): r["weight"]
        for r in edges.where("edge_type = 'category_child_of'").collect()
    }
    assert chain[("10", "kitchen.mixer")] == pytest.approx(I1 + 1e-9)


def test_every_edge_has_its_reverse_with_the_same_weight(day_graph):
    by_key = {(r["src"], r["dst"], r["edge_type"]): r for r in day_graph}
    reverse_name = {}
    for r in day_graph:
        back = [
            b
            for (s, d, t), b in by_key.items()
            if (s, d) == (r["dst"], r["src"]) and b["funnel"] == r["funnel"]
        ]
        assert back, f"no reverse of {r['edge_type']} {r['src_raw']}->{r['dst_raw']}"
        matching = [b for b in back if b["event_count"] == r["event_count"] and b["weight"] == r["weight"]]
        assert matching
        reverse_name.setdefault(r["edge_type"], set()).update(b["edge_type"] for b in matching)
    assert reverse_name["user_view_item"] == {"item_viewed_by_user"}
    assert reverse_name["category_parent_of"] == {"category_child_of"}


def test_window_never_reads_after_ds_nor_before_lookback(day_graph):
    raw = {(r["source"], r["src_type"], r["src_raw"]) for r in day_graph}
    assert ("shop", "user", "u3") not in raw  # only active on ds + 1
    assert ("shop", "user", "u4") not in raw and ("shop", "item", "i3") not in raw  # 40 days before ds
    assert ("shop", "advertiser", "later") not in raw  # i2's brand appears on ds + 1
    counted = sum(r["event_count"] for r in day_graph if r["src_type"] == "user")
    assert counted == 6  # 9 events: minus the removal, the day after, the one before the window


def test_node_ids_are_stable_across_days_and_distinct_across_sources(spark, inputs, day_graph):
    events, entities = inputs
    earlier = graph_nodes(graph_edges(events, entities, GraphConfig(ds=day(-1)))).collect()
    today = {(r["source"], r["src_type"], r["src_raw"]): r["src"] for r in day_graph}
    before = {(r["source"], r["node_type"], r["raw_id"]): r["node_id"] for r in earlier}
    shared = set(today) & set(before)
    assert {("shop", "user", "u1"), ("shop", "item", "i1"), ("shop", "category", "kitchen")} <= shared
    assert all(today[key] == before[key] for key in shared)
    assert ("shop", "user", "u2") in shared and (
        "other",
        "user",
        "u1",
    ) not in before  # other's event is on ds
    assert today[("shop", "user", "u1")] != today[("other", "user", "u1")]
    assert 0 not in today.values()


def test_degree_cap_keeps_the_heaviest_edges_per_type(spark):
    # Hub item h viewed by 12 users, user u<k> viewing it k times: h's view list is capped at its 3 heaviest.
    rows = [event(f"u{k}", "h", "view", 0, 8) for k in range(1, 13) for _ in range(k)]
    events = frame(spark, rows, EVENTS.schema)
    entities = frame(spark, [], ENTITIES.schema)
    cfg = GraphConfig(ds=D, degree_cap=3, salts=4)
    edges = graph_edges(events, entities, cfg)
    capped = (
        cap_degree(edges, cfg).select("src_raw", "dst_raw", "edge_type", "weight", "rank_in_type").collect()
    )
    hub = sorted((r["rank_in_type"], r["dst_raw"], r["weight"]) for r in capped if r["src_raw"] == "h")
    assert hub == [(1, "u12", 12.0), (2, "u11", 11.0), (3, "u10", 10.0)]
    users = {r["src_raw"] for r in capped if r["edge_type"] == "user_view_item"}
    assert users == {f"u{k}" for k in range(1, 13)}  # every user keeps its one edge to the hub
    degree = {r["raw_id"]: r["degree"] for r in graph_nodes(edges).collect()}
    assert degree["h"] == 12  # the node's degree counts edges before the cap


def test_recency_buckets_and_weights_helpers(spark):
    ages = spark.range(41).select(recency_bucket(F.col("id").cast("int")).alias("b")).collect()
    buckets = [r["b"] for r in ages]
    assert buckets[:9] == list(range(9))
    assert [buckets[a] for a in (9, 10, 12, 14, 16, 19, 20, 23, 26, 27, 40)] == [
        8,
        9,
        10,
        11,
        12,
        12,
        13,
        14,
        14,
        15,
        15,
    ]


def test_id_collision_fails_loudly(spark):
    clash = frame(
        spark,
        [(42, "shop", "user", "a"), (42, "shop", "item", "b"), (7, "shop", "user", "c")],
        StructType([NODES.schema[c] for c in ("node_id", "source", "node_type", "raw_id")]),
    )
    with pytest.raises(HirError, match=r"node id 42 is shared by 2 node keys \(shop:item:b, shop:user:a\)"):
        node_stats(clash)


@pytest.fixture(scope="module")
def warehouse_with_events(spark, inputs, tmp_path_factory):
    events, entities = inputs
    warehouse = tmp_path_factory.mktemp("graph") / "warehouse"
    write_table(events, EVENTS, warehouse, None)
    write_table(entities, ENTITIES, warehouse, None)
    return warehouse


def test_job_writes_reconciled_day_and_rerun_replaces_it(spark, warehouse_with_events, capsys):
    argv = ["--ds", D.isoformat(), "--warehouse", str(warehouse_with_events)]
    assert build_graph.main(argv) == 0
    assert build_graph.main(argv) == 0  # a rerun replaces the day, never appends
    out = capsys.readouterr().out
    assert "graph 2024-03-10: events 7 = in user-item edges 6 + ignored 1 (reconciled)" in out
    assert "nodes: advertiser 1, category 4, item 3, user 3" in out
    nodes = read_table(spark, NODES, warehouse_with_events)
    edges = read_table(spark, EDGES, warehouse_with_events)
    assert nodes.count() == 11 and edges.where(F.col("ds") == D).count() == 20
    assert {r["ds"] for r in edges.select("ds").distinct().collect()} == {D}


def test_job_errors_are_one_line(spark, warehouse_with_events):
    with pytest.raises(HirError, match="no events between 2023-12-02 and 2024-01-01"):
        build_graph.main(["--ds", "2024-01-01", "--warehouse", str(warehouse_with_events)])
    with pytest.raises(HirError, match="--ds must be a date"):
        build_graph.main(["--ds", "2024-13-01"])
    with pytest.raises(HirError, match="--half-life-days must be positive"):
        build_graph.main(["--ds", "2024-01-01", "--half-life-days", "0"])
