"""sample-neighbourhoods: exact rows on a tiny graph, tree structure, determinism, exact salted top-k, the
sampling distribution, the job on a warehouse and on real data."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StructField, StructType

from hir_model.batch import batch_from_columns
from jobs import sample_neighbourhoods as job
from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from jobs.graph.topk import top_k
from jobs.sample_neighbourhoods import SampleConfig, draw, sample_neighbourhoods
from schemas.codes import EDGE_TYPES, NODE_TYPES
from schemas.tables import EDGES, NEIGHBOURHOODS, NODES

D = dt.date(2024, 3, 10)
T = dt.datetime(2024, 3, 10, 12)
CFG = SampleConfig(ds=D, k1=2, k2=2, user_k1=3, max_tokens=12, seed=3, salts=4)
REVERSE = {
    "user_view_item": "item_viewed_by_user",
    "user_purchase_item": "item_purchased_by_user",
    "user_cart_item": "item_carted_by_user",
    "user_favourite_item": "item_favourited_by_user",
    "item_in_category": "category_has_item",
}
DEEP = {"user_purchase_item", "user_cart_item", "item_purchased_by_user", "item_carted_by_user"}


def frame(spark, rows, schema):
    """A DataFrame of inline rows, through Arrow: no Python worker tasks, several times faster to run."""
    return spark.createDataFrame(pd.DataFrame(rows, columns=schema.names), schema)


def node_type_of(node: int) -> str:
    return {1: "user", 2: "item", 3: "category", 4: "advertiser"}[node // 1000]


def graph_rows() -> tuple[list[tuple], list[tuple]]:
    """Nodes and edges (with reverses) of a small graph: a hand-checked corner and a seeded random part.

    Ids: users 1xxx, items 2xxx, categories 3xxx. The corner: u1001 viewed i2001 and bought i2002; i2001 is in
    category c3001; u1002 viewed i2002; u1003 has no edge (cold). The random part: 40 users viewing (and a few
    carting) items i2100..i2119 in four categories, every user viewing the hub i2100.
    """
    forward = [
        (1001, 2001, "user_view_item", 1.5, 0),
        (1001, 2002, "user_purchase_item", 5.0, 2),
        (2001, 3001, "item_in_category", 2.0, 0),
        (1002, 2002, "user_view_item", 1.0, 1),
    ]
    rng = random.Random(11)
    for item in range(2100, 2120):
        forward.append((item, 3100 + item % 4, "item_in_category", 3.0, 0))
    for user in range(1100, 1140):
        forward.append((user, 2100, "user_view_item", float(rng.randint(1, 9)), rng.randint(0, 15)))
        for item in rng.sample(range(2101, 2120), rng.randint(1, 6)):
            forward.append((user, item, "user_view_item", float(rng.randint(1, 20)) / 4, rng.randint(0, 15)))
        if rng.random() < 0.3:
            forward.append((user, rng.randint(2101, 2119), "user_cart_item", 3.0, 0))
    edges = []
    for src, dst, edge_type, weight, recency in forward:
        for a, b, t in ((src, dst, edge_type), (dst, src, REVERSE[edge_type])):
            funnel = "deep" if t in DEEP else ("attribute" if "category" in t else "upper")
            edges.append((a, b, node_type_of(a), node_type_of(b), t, funnel, weight, 1, T, T, recency, 1, D))
    node_ids = sorted({e[0] for e in edges} | {1003})
    nodes = [(n, "test", node_type_of(n), f"n{n}", sum(e[0] == n for e in edges), D) for n in node_ids]
    return nodes, edges


@pytest.fixture(scope="module")
def graph(spark):
    nodes, edges = graph_rows()
    return frame(spark, nodes, NODES.schema), frame(spark, edges, EDGES.schema)


@pytest.fixture(scope="module")
def sampled(spark, graph):
    """CFG's sample of every user and item, collected once: {target node id: row}."""
    return {r["node_id"]: r for r in sample_neighbourhoods(*graph, CFG).collect()}


def test_hand_checked_rows_upper_funnel_only_and_cold(spark, sampled):
    pad = CFG.max_tokens - 5
    expected = [
        # u1001: hop 1 = its view (i2001) then its purchase (i2002), round-robin by edge type code;
        # hop 2 = i2001's category and i2002's other buyer/viewer u1002 (u1001 itself is never a hop-2 token).
        (
            1001,
            5,
            2,
            [1001, 2001, 2002, 3001, 1002] + [0] * pad,
            [1, 2, 2, 4, 1] + [0] * pad,
            [1, EDGE_TYPES["user_view_item"], EDGE_TYPES["user_purchase_item"], 10, 6] + [0] * pad,
            [0, 1, 1, 2, 2] + [0] * pad,
            [-1, 0, 0, 1, 2] + [-1] * pad,
            [0, 0, 2, 0, 1] + [0] * pad,
            [0.0, 1.5, 5.0, 2.0, 1.0] + [0.0] * pad,
            [False, False, True, False, False] + [False] * pad,
        ),
        (
            # u1002 only viewed (upper funnel): its row still reaches the deep funnel through i2002's buyer.
            1002,
            3,
            1,
            [1002, 2002, 1001] + [0] * (pad + 2),
            [1, 2, 1] + [0] * (pad + 2),
            [1, EDGE_TYPES["user_view_item"], EDGE_TYPES["item_purchased_by_user"]] + [0] * (pad + 2),
            [0, 1, 2] + [0] * (pad + 2),
            [-1, 0, 1] + [-1] * (pad + 2),
            [0, 1, 2] + [0] * (pad + 2),
            [0.0, 1.0, 5.0] + [0.0] * (pad + 2),
            [False, False, True] + [False] * (pad + 2),
        ),
        (
            1003,  # cold: no edge at all, still a valid row holding the target only
            1,
            0,
            [1003] + [0] * (pad + 4),
            [1] + [0] * (pad + 4),
            [1] + [0] * (pad + 4),
            [0] * (pad + 5),
            [-1] * (pad + 5),
            [0] * (pad + 5),
            [0.0] * (pad + 5),
            [False] * (pad + 5),
        ),
    ]
    columns = ["node_id", "num_tokens", "num_hop1", *[f"token_{f}" for f in job.TOKEN_FIELDS]]
    schema = StructType([NEIGHBOURHOODS.schema[c] for c in columns])
    actual = [tuple(sampled[n][c] for c in columns) for n in (1001, 1002, 1003)]
    assert_df_equality(frame(spark, actual, schema), frame(spark, expected, schema), ignore_row_order=True)
    assert sampled[1001]["sample_seed"] == 3 and sampled[1001]["source"] == "test"
    assert {NODE_TYPES[r["node_type"]] for r in sampled.values()} == {
        1,
        2,
    }  # default targets: users and items


def test_every_row_is_a_valid_tree_of_real_edges(sampled):
    nodes, edges = graph_rows()
    edge_of = {(e[0], e[1], EDGE_TYPES[e[4]]): e for e in edges}
    degree_by_type = Counter((e[0], EDGE_TYPES[e[4]]) for e in edges)
    truncated = 0
    for target, row in sampled.items():
        n, h1 = row["num_tokens"], row["num_hop1"]
        tokens = list(
            zip(*[row[f"token_{f}"] for f in job.TOKEN_FIELDS], strict=True)
        )  # (node, type, edge, hop, parent, recency, weight, deep)
        assert len(tokens) == CFG.max_tokens
        assert tokens[0][:5] == (target, NODE_TYPES[row["node_type"]], 1, 0, -1)
        assert all(t == (0, 0, 0, 0, -1, 0, 0.0, False) for t in tokens[n:]), (
            "explicit padding after num_tokens"
        )
        per_type, per_parent = Counter(), Counter()
        for pos, (node, ntype, etype, hop, parent, recency, weight, deep) in enumerate(tokens[1:n], start=1):
            assert (hop, parent == 0) == ((1, True) if pos <= h1 else (2, False))
            if hop == 2:
                assert 1 <= parent <= h1, "a hop-2 token hangs under a hop-1 token of the same row"
                assert node != target
                per_parent[parent] += 1
                src = tokens[parent][0]
            else:
                per_type[etype] += 1
                src = target
            edge = edge_of[(src, node, etype)]  # KeyError: a token that is not an edge of the graph
            assert (weight, recency, deep, ntype) == (
                edge[6],
                edge[10],
                edge[5] == "deep",
                NODE_TYPES[edge[3]],
            )
        assert all(c <= CFG.k2 for c in per_parent.values())
        full = n < CFG.max_tokens
        truncated += not full
        budget = CFG.user_k1 if node_type_of(target) == "user" else CFG.k1
        for (src, etype), degree in degree_by_type.items():
            if src == target:
                assert per_type[etype] <= budget
                if full:
                    assert per_type[etype] == min(budget, degree), "hop 1 takes its budget per edge type"
        if full:
            for pos in range(1, h1 + 1):
                parent_node = tokens[pos][0]
                others = {e[1] for e in edges if e[0] == parent_node and e[1] != target}
                assert per_parent[pos] == min(CFG.k2, len(others)), "k2 distinct neighbours under each parent"
    assert truncated > 0  # some users have more than max_tokens: those rows are cut, still valid trees
    batch = batch_from_columns(
        {
            c: [r[c] for r in sampled.values()]
            for c in ["num_tokens", *[f"token_{f}" for f in job.TOKEN_FIELDS]]
        }
    )
    assert batch.node_id.shape == (len(sampled), CFG.max_tokens)  # the model's loader accepts every row


def test_rerun_is_identical_and_the_seed_changes_the_draw(graph, sampled):
    again = {r["node_id"]: r for r in sample_neighbourhoods(*graph, CFG).collect()}
    assert again == sampled
    other = sample_neighbourhoods(*graph, SampleConfig(**{**CFG.__dict__, "seed": 4})).collect()
    changed = sum(r["token_node_id"] != sampled[r["node_id"]]["token_node_id"] for r in other)
    assert changed > 5


def test_salted_top_k_equals_plain_top_k_with_a_hub_and_ties(spark):
    # Hub 1 has 400 candidates whose scores tie in groups of 3; nodes 2..30 have a handful.
    rows = [(1, dst, float(dst // 3 % 50)) for dst in range(400)]
    rows += [(src, dst, float(dst % 4)) for src in range(2, 31) for dst in range(src % 7)]
    schema = StructType(
        [
            StructField("src", LongType()),
            StructField("dst", IntegerType()),
            StructField("score", DoubleType()),
        ]
    )
    df = frame(spark, rows, schema)
    order = [F.col("score").desc()]
    salted = top_k(df, ["src"], order, "dst", 5, salts=8)
    plain = top_k(df, ["src"], order, "dst", 5, salts=1)
    assert_df_equality(salted, plain, ignore_row_order=True)
    hub = sorted((r["rank"], r["dst"]) for r in salted.where("src = 1").collect())
    expected = sorted(rows[:400], key=lambda r: (-r[2], r[1]))[:5]
    assert hub == [(i + 1, r[1]) for i, r in enumerate(expected)]


def test_draws_follow_the_weights(spark):
    """Efraimidis-Spirakis on 4000 stars with leaf weights 1, 2, 3, 4, 10: the first and the second draw follow
    their exact distributions (chi-square, 4 degrees of freedom, p = 0.001 -> 18.47)."""
    weights = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 10.0}
    stars = 4000
    rows = [
        (centre, leaf, "user", "item", "user_view_item", "upper", w, 1, T, T, 0, 1, D)
        for centre in range(1000, 1000 + stars)
        for leaf, w in weights.items()
    ]
    edges = frame(spark, rows, EDGES.schema)
    cfg = SampleConfig(ds=D, k1=2, k2=0, seed=1)
    counts = {
        (r["rank"], r["dst"]): r["n"]
        for r in draw(edges, cfg).groupBy("rank", "dst").agg(F.count(F.lit(1)).alias("n")).collect()
    }
    total = sum(weights.values())
    first = {leaf: w / total for leaf, w in weights.items()}
    second = {
        leaf: sum(first[other] * w / (total - weights[other]) for other in weights if other != leaf)
        for leaf, w in weights.items()
    }
    for rank, p in ((1, first), (2, second)):
        chi2 = sum((counts.get((rank, leaf), 0) - stars * q) ** 2 / (stars * q) for leaf, q in p.items())
        assert chi2 < 18.47, f"draw {rank}: chi-square {chi2:.1f}"
    # A sampler that ignored the weights would fail: the heaviest leaf is drawn first ~half of the time.
    assert counts[(1, 5)] > 0.4 * stars


def test_the_user_budget_is_the_90th_percentile_of_distinct_items_within_bounds(graph):
    _, edges = graph
    _, rows = graph_rows()
    items = Counter((e[0], e[4]) for e in rows if node_type_of(e[0]) == "user")  # (user, edge type) -> items
    by_type: dict[str, list[int]] = {}
    for (_, edge_type), count in items.items():
        by_type.setdefault(edge_type, []).append(count)
    # Spark's percentile: linear interpolation between the closest ranks.
    p90 = max(round(float(np.percentile(counts, 90))) for counts in by_type.values())
    auto = SampleConfig(ds=D, k1=2, k2=2, max_tokens=40)
    assert job.user_budget(edges, auto) == max(2, min(p90, 39)) and p90 > 2
    assert job.user_budget(edges, dataclasses.replace(auto, max_tokens=4)) == 3  # at most max_tokens - 1
    assert job.user_budget(edges, dataclasses.replace(auto, k1=50, max_tokens=64)) == 50  # at least k1
    assert (
        job.user_budget(edges, dataclasses.replace(auto, user_k1=7, max_tokens=5)) == 4
    )  # a given budget, cut


def test_job_writes_the_day_and_reports(spark, graph, tmp_path, capsys):
    nodes, edges = graph
    warehouse = tmp_path / "warehouse"
    write_table(nodes, NODES, warehouse, None)
    write_table(edges, EDGES, warehouse, None)
    argv = [
        "--ds",
        D.isoformat(),
        "--warehouse",
        str(warehouse),
        "--k1",
        "2",
        "--k2",
        "2",
        "--max-tokens",
        "12",
    ]
    assert job.main([*argv, "--seed", "3", "--salts", "4"]) == 0
    out = capsys.readouterr().out
    assert "neighbourhoods 2024-03-10 user: 43 rows" in out and "1 with the target only" in out
    written = read_table(spark, NEIGHBOURHOODS, warehouse)
    assert written.count() == 43 + 22
    with pytest.raises(HirError, match="no nodes for 2024-03-11"):
        job.main(["--ds", "2024-03-11", "--warehouse", str(warehouse)])
    with pytest.raises(HirError, match="--node-types: unknown type 'shop'"):
        job.main(["--ds", "2024-03-11", "--node-types", "user,shop"])


@pytest.mark.slow
def test_both_jobs_on_real_rees46(spark, shared_data, tmp_path, capsys):
    """REES46's first hours: ingest, build the graph (brands, category codes), sample; the model loads the rows."""
    from jobs import build_graph, ingest_events

    warehouse = str(tmp_path / "warehouse")
    csv = shared_data / "rees46_oct2019" / "2019-Oct_head.csv"
    assert ingest_events.main(["--source", "rees46", "--input", str(csv), "--warehouse", warehouse]) == 0
    assert build_graph.main(["--ds", "2019-10-01", "--warehouse", warehouse]) == 0
    assert job.main(["--ds", "2019-10-01", "--warehouse", warehouse]) == 0
    out = capsys.readouterr().out
    # 17,433 events kept by ingest (one truncated line rejected, 5 duplicates): all views, carts and purchases.
    assert "reconciled" in out and "DOES NOT RECONCILE" not in out
    nodes = {
        r["node_type"]: r["n"]
        for r in read_table(spark, NODES, warehouse)
        .groupBy("node_type")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    }
    assert nodes["user"] == 4504 and nodes["advertiser"] > 800 and nodes["category"] > 434
    rows = read_table(spark, NEIGHBOURHOODS, warehouse).toPandas()
    assert len(rows) == nodes["user"] + nodes["item"]
    batch = batch_from_columns(
        {c: rows[c].to_numpy() for c in rows.columns if c.startswith("token_") or c == "num_tokens"}
    )
    assert int(batch.is_deep.any(dim=1).sum()) > 0 and int(batch.num_tokens.min()) >= 2
