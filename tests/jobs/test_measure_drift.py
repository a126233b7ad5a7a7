"""hir drift: an entity compared with itself on the previous day, split by whether its neighbourhood changed."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from pyspark.sql import Row

from jobs.drift.measure import cohort_stats, day_view, nearest, neighbour_overlap, paired
from jobs.measure_drift import DriftConfig, over_threshold

D1, D2 = dt.date(2026, 1, 6), dt.date(2026, 1, 7)


def tables(spark):
    # Items 1 and 2 keep their neighbours (in another order on day 2), item 3 gains one; user 9 is new on day 2.
    embeddings = spark.createDataFrame(
        [
            Row(entity_type="item", node_id=1, vector=[1.0, 0.0], model_version="m1", ds=D1),
            Row(entity_type="item", node_id=1, vector=[0.6, 0.8], model_version="m2", ds=D2),
            Row(entity_type="item", node_id=2, vector=[0.0, 1.0], model_version="m1", ds=D1),
            Row(entity_type="item", node_id=2, vector=[0.0, 1.0], model_version="m2", ds=D2),
            Row(entity_type="item", node_id=3, vector=[1.0, 0.0], model_version="m1", ds=D1),
            Row(entity_type="item", node_id=3, vector=[0.0, 1.0], model_version="m2", ds=D2),
            Row(entity_type="user", node_id=9, vector=[1.0, 0.0], model_version="m2", ds=D2),
        ]
    )
    tokens = spark.createDataFrame(
        [
            Row(node_id=n, bom_level=level, rank=rank, token=token, ds=ds)
            for n, ds, level, rank, token in [
                (1, D1, 0, 1, "L0:1"),
                (1, D1, 1, 1, "L1:1.4"),
                (1, D1, 0, 2, "L0:2"),
                (1, D2, 0, 1, "L0:1"),
                (1, D2, 1, 1, "L1:1.5"),
                (1, D2, 0, 2, "L0:3"),
                (2, D1, 0, 1, "L0:2"),
                (2, D1, 1, 1, "L1:2.0"),
                (2, D2, 0, 1, "L0:2"),
                (2, D2, 1, 1, "L1:2.0"),
                (3, D1, 0, 1, "L0:0"),
                (3, D1, 1, 1, "L1:0.0"),
                (3, D2, 0, 1, "L0:1"),
                (3, D2, 1, 1, "L1:1.0"),
            ]
        ]  # fmt: skip
    )
    neighbourhoods = spark.createDataFrame(
        [
            Row(node_id=1, token_node_id=[1, 7, 8, 0, 0], ds=D1),
            Row(node_id=1, token_node_id=[1, 8, 7, 0, 0], ds=D2),
            Row(node_id=2, token_node_id=[2, 7, 0, 0, 0], ds=D1),
            Row(node_id=2, token_node_id=[2, 7, 0, 0, 0], ds=D2),
            Row(node_id=3, token_node_id=[3, 7, 0, 0, 0], ds=D1),
            Row(node_id=3, token_node_id=[3, 7, 8, 0, 0], ds=D2),
            Row(node_id=9, token_node_id=[9, 1, 0, 0, 0], ds=D2),
        ]
    )
    return embeddings, tokens, neighbourhoods


def test_cohorts_cosines_and_kept_tokens_per_entity_type(spark) -> None:
    embeddings, tokens, neighbourhoods = tables(spark)
    pairs = paired(
        day_view(embeddings, tokens, neighbourhoods, D2), day_view(embeddings, tokens, neighbourhoods, D1)
    )
    by_entity = {r["node_id"]: r for r in pairs.collect()}
    assert sorted(by_entity) == [1, 2, 3]  # user 9 has no previous day
    assert by_entity[1]["cosine"] == pytest.approx(0.6) and by_entity[3]["cosine"] == pytest.approx(0.0)
    assert [by_entity[n]["cohort"] for n in (1, 2, 3)] == ["unchanged", "unchanged", "changed"]
    stats = {(r["entity_type"], r["cohort"]): r for r in cohort_stats(pairs).collect()}
    assert sorted(stats) == [("item", "all"), ("item", "changed"), ("item", "unchanged")]
    unchanged = stats[("item", "unchanged")]
    assert unchanged["entities"] == 2
    assert unchanged["cosine_mean"] == pytest.approx(0.8)
    # exact percentiles, interpolated between 0.6 and 1.0
    assert (unchanged["cosine_p10"], unchanged["cosine_p50"], unchanged["cosine_p90"]) == pytest.approx(
        (0.64, 0.8, 0.96)
    )
    assert unchanged["level0_kept"] == pytest.approx(1.0)  # rank-2 tokens do not count
    assert unchanged["level1_kept"] == pytest.approx(0.5)  # item 1's level-1 path moved
    assert stats[("item", "changed")]["level0_kept"] == pytest.approx(0.0)
    assert stats[("item", "all")]["entities"] == 3
    assert stats[("item", "all")]["cosine_mean"] == pytest.approx(1.6 / 3)
    assert (unchanged["model_version"], unchanged["previous_model_version"]) == ("m2", "m1")


def test_nearest_neighbours_leave_the_query_out_and_overlap_counts_the_shared_ones(spark) -> None:
    corpus = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]], dtype=np.float32)
    top = nearest(corpus[[0, 2]], corpus, np.array([0, 2]), 1)
    assert top[:, 0].tolist() == [1, 3]
    embeddings, tokens, neighbourhoods = tables(spark)
    pairs = paired(
        day_view(embeddings, tokens, neighbourhoods, D2), day_view(embeddings, tokens, neighbourhoods, D1)
    )
    overlap = neighbour_overlap(pairs, sample=3, corpus_cap=10, k=1)
    assert overlap[("item", "all")][1] == 3 and overlap[("item", "unchanged")][1] == 2
    # Item 3 (changed): day 1 nearest other is item 1 ([1,0]); day 2 it is item 2 ([0,1] == its own vector).
    assert overlap[("item", "changed")] == (0.0, 1)


def test_the_threshold_judges_unchanged_entities_of_types_with_enough_of_them() -> None:
    rows = [
        {"entity_type": "item", "cohort": "unchanged", "entities": 50, "cosine_p50": 0.85},
        {"entity_type": "item", "cohort": "changed", "entities": 50, "cosine_p50": 0.1},
        {"entity_type": "user", "cohort": "unchanged", "entities": 5, "cosine_p50": 0.2},
    ]
    cfg = DriftConfig(ds=D2, max_drift=0.1)
    assert "item drift 0.150" in over_threshold(rows, cfg)
    assert "user" not in over_threshold(rows, cfg)  # 5 < --min-entities 20
    assert over_threshold(rows, DriftConfig(ds=D2, max_drift=0.2)) is None
    assert over_threshold(rows, DriftConfig(ds=D2)) is None  # no threshold: never fails
