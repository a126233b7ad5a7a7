"""The ranking task on the synthetic source: a signal planted in HIR's features only is found, folds never leak."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from pyspark.sql.types import FloatType, IntegerType, LongType, StringType, StructField, StructType

from jobs.common.delta import read_table
from jobs.eval import baselines as bl
from jobs.eval import features as fx
from jobs.eval import ranking as rk
from jobs.eval.split import temporal_split
from jobs.ingest_events import IngestConfig, ingest
from jobs.sources.synthetic import SyntheticSpec
from schemas.tables import ENTITIES, EVENTS

CANDIDATES = 40


def planted_bit(node: int) -> int:
    """A hidden side of every user and item: a hash of its node id, unrelated to anything in the events."""
    return int((node * 0x9E3779B97F4A7C15 >> 17) & 1)


@pytest.fixture(scope="module")
def planted(spark, tmp_path_factory):
    """Synthetic history and catalog; candidates drawn at random from the catalog; targets the candidates on the
    user's hidden side (a quarter of them); HIR's vectors and level-0 tokens carry the side, nothing else does."""
    warehouse = tmp_path_factory.mktemp("ranking") / "synthetic"
    spec = SyntheticSpec(users=160, items=400, events=6000, days=3, seed=11)
    ingest(spark, IngestConfig(source="synthetic", synthetic=spec, warehouse=str(warehouse)))
    events = read_table(spark, EVENTS, warehouse)
    split = temporal_split(
        events, read_table(spark, ENTITIES, warehouse), dt.datetime(2026, 1, 3, tzinfo=dt.UTC)
    )
    ui = bl.interactions(split.history).cache()
    users = np.array(sorted(r["user"] for r in ui.select("user").distinct().collect()), dtype=np.int64)
    items = np.array(
        sorted(r["item"] for r in split.catalog.select(bl.item_node("entity_id").alias("item")).collect()),
        dtype=np.int64,
    )
    rng = np.random.default_rng(0)
    lists, scores, targets = {}, {}, {}
    for user in users.tolist():
        chosen = rng.choice(items, size=CANDIDATES, replace=False)
        lists[user], scores[user] = chosen, np.sort(rng.random(CANDIDATES))[::-1].copy()
        same_side = [i for i in chosen.tolist() if planted_bit(i) == planted_bit(user)]
        # Half of them at random: not the first half, which co-visitation's (list-order) rank would give away.
        targets[user] = set(rng.permutation(same_side)[: max(1, len(same_side) // 2)].tolist())
    vectors = {}
    for node in [*users.tolist(), *items.tolist()]:
        v = np.concatenate([[1.0 if planted_bit(node) else -1.0], 0.5 * rng.standard_normal(3)])
        vectors[node] = (v / np.linalg.norm(v)).astype(np.float32)
    # HIR's own list: the same candidates by cosine (so the union is unchanged and HIR's rank is a feature).
    hir_lists, hir_scores = {}, {}
    for user, chosen in lists.items():
        cosine = np.array([float(vectors[user] @ vectors[i]) for i in chosen.tolist()])
        order = np.argsort(-cosine, kind="stable")
        hir_lists[user], hir_scores[user] = chosen[order], cosine[order]
    schema = StructType(
        [
            StructField("entity_type", StringType()),
            StructField("node_id", LongType()),
            StructField("bom_level", IntegerType()),
            StructField("token", StringType()),
            StructField("weight", FloatType()),
            StructField("rank", IntegerType()),
        ]
    )
    bags = [("user", u, 0, f"L0:{planted_bit(u)}", 1.0, 1) for u in users.tolist()]
    bags += [("item", i, 0, f"L0:{planted_bit(i)}", 1.0, 1) for i in items.tolist()]
    tokens = spark.createDataFrame(bags, schema)
    frame, groups, _ = fx.ranking_frame(
        spark,
        {"co_visitation": (lists, scores), "hir": (hir_lists, hir_scores)},
        users,
        targets,
        CANDIDATES,
        history=split.history,
        ui=ui,
        catalog=split.catalog,
        tokens=tokens,
        vectors_for=lambda ids: {int(i): vectors[int(i)] for i in ids.tolist() if int(i) in vectors},
    )
    return frame, groups, users, targets


def features_of(groups, ranker):
    return [f for g in rk.RANKERS[ranker] for f in groups[g]]


@pytest.mark.slow
def test_a_signal_only_hir_features_carry_makes_base_plus_hir_beat_base(planted):
    frame, groups, users, targets = planted
    assert frame["label"].sum() > 0 and set(frame["user"]) == set(users.tolist())
    # The base features are computed from the real history: real values, and none of them knows the side.
    assert frame["ui_view_events"].sum() > 0 and frame["category_affinity"].notna().all()
    folds_of = rk.user_folds(users.tolist(), rk.FOLDS, seed=0)
    runs = {
        name: rk.fit_ranker(frame, name, features_of(groups, name), folds_of, seed=0) for name in rk.RANKERS
    }
    rows = rk.ranking_rows(
        frame, runs, {"all": targets}, ks=(10, 50), per_generator=CANDIDATES, samples=200, seed=0
    )
    at = {(r["method"], r["metric"], r["k"]): r for r in rows}
    for ranker in ("base+hir", "base+hir_embedding", "base+hir_tokens"):
        lift = at[(ranker, "ndcg_lift", 10)]
        assert lift["ci_low"] > 0.0, (ranker, lift)  # the planted side is found, with the CI above zero
    # Half of a user's candidates are on its side and half of those are targets: knowing the side doubles the
    # hit rate of a random order, so NDCG@10 must rise by far more than noise.
    assert at[("base+hir", "ndcg", 10)]["value"] > 1.5 * at[("base", "ndcg", 10)]["value"]
    assert at[("base+hir", "auc", 0)]["value"] > 0.7 > at[("base", "auc", 0)]["value"]
    assert at[("candidate_union", "recall", CANDIDATES)]["value"] == pytest.approx(1.0)
    shares = rk.group_importance(runs["base+hir"], groups)
    assert shares["hir_embedding"] + shares["hir_tokens"] > 0.5


@pytest.mark.slow
def test_no_user_is_both_trained_and_tested_on_and_its_labels_never_reach_its_scores(planted):
    frame, groups, users, _ = planted
    folds_of = rk.user_folds(users.tolist(), rk.FOLDS, seed=3)
    assert rk.user_folds(users.tolist(), rk.FOLDS, seed=3) == folds_of  # seeded
    sizes = np.bincount(list(folds_of.values()), minlength=rk.FOLDS)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == len(users)
    run = rk.fit_ranker(frame, "base+hir", features_of(groups, "base+hir"), folds_of, seed=3)
    tested = [u for plan in run.plans for u in plan.test_users]
    assert sorted(tested) == sorted(users.tolist())  # each user tested exactly once
    for plan in run.plans:
        assert not plan.train_users & plan.test_users
        assert plan.stop_users <= plan.train_users
        assert {folds_of[u] for u in plan.test_users} == {plan.fold}
    # Flip the labels of fold 0's users: the scores of fold 0 (from a model that never saw them) do not move,
    # while the other folds' models, which train on them, do.
    flipped = frame.copy()
    in_fold0 = flipped["user"].map(folds_of) == 0
    flipped.loc[in_fold0, "label"] = 1.0 - flipped.loc[in_fold0, "label"]
    again = rk.fit_ranker(flipped, "base+hir", features_of(groups, "base+hir"), folds_of, seed=3)
    np.testing.assert_array_equal(again.scores[in_fold0.to_numpy()], run.scores[in_fold0.to_numpy()])
    assert not np.array_equal(again.scores[~in_fold0.to_numpy()], run.scores[~in_fold0.to_numpy()])


def test_token_features_by_hand(spark):
    """Two users, two items, bags worked out by hand: overlap sums the smaller weights of shared tokens."""
    schema = "entity_type string, node_id long, bom_level int, token string, weight float, rank int"
    tokens = spark.createDataFrame(
        [
            ("user", 1, 0, "L0:a", 0.7, 1), ("user", 1, 0, "L0:b", 0.3, 2),
            ("user", 2, 0, "L0:c", 1.0, 1),
            ("item", 10, 0, "L0:b", 0.6, 1), ("item", 10, 0, "L0:a", 0.4, 2),
            ("item", 11, 0, "L0:d", 1.0, 1),
        ],
        schema,
    )  # fmt: skip
    cands = spark.createDataFrame([(1, 10), (1, 11), (2, 10), (3, 10)], "user long, item long")
    got = {(r["user"], r["item"]): r for r in fx.token_features(cands, tokens, [0]).collect()}
    assert got[(1, 10)]["tok_l0_overlap"] == pytest.approx(0.3 + 0.4)
    assert got[(1, 10)]["tok_l0_shared"] == 2.0
    assert got[(1, 10)]["tok_l0_item_token_in_user_bag"] == 1.0  # item 10's top token b is in user 1's bag
    assert got[(1, 10)]["tok_l0_user_weight_on_item_token"] == pytest.approx(0.3)
    assert got[(1, 11)]["tok_l0_overlap"] == 0.0 and got[(1, 11)]["tok_l0_item_token_in_user_bag"] == 0.0
    assert got[(2, 10)]["tok_l0_shared"] == 0.0
    assert got[(3, 10)]["tok_l0_overlap"] is None  # user 3 has no bag: unknown, not "no overlap"


def test_candidates_are_the_union_of_each_generators_top_n_with_every_score_and_rank():
    tops = {
        "co_visitation": ({1: np.array([10, 11, 12])}, {1: np.array([3.0, 2.0, 1.0])}),
        "hir": ({1: np.array([12, 13, 14]), 2: np.array([10])}, {1: np.array([0.9, 0.8, 0.7]), 2: np.array([0.5])}),
    }  # fmt: skip
    frame = fx.candidate_frame(tops, np.array([1, 2]), per_generator=2)
    assert [tuple(r) for r in frame[["user", "item"]].to_numpy()] == [
        (1, 10),
        (1, 11),
        (1, 12),
        (1, 13),
        (2, 10),
    ]
    row = frame[(frame["user"] == 1) & (frame["item"] == 12)].iloc[0]
    # Item 12 is co-visitation's third (beyond its top 2) and HIR's first: both ranks are features.
    assert row["co_visitation_rank"] == 3 and row["hir_rank"] == 1 and row["co_visitation_score"] == 1.0
    assert np.isnan(frame[(frame["user"] == 1) & (frame["item"] == 10)].iloc[0]["hir_rank"])


def test_per_user_auc_by_hand():
    import pandas as pd

    frame = pd.DataFrame({"user": [1, 1, 1, 1, 2, 2], "item": [1, 2, 3, 4, 5, 6]})
    scores = np.array([0.9, 0.1, 0.5, 0.3, 0.2, 0.2])
    auc = rk.per_user_auc(frame, scores, {1: {1, 4}, 2: {5}})
    # user 1: positives 0.9 and 0.3 against negatives 0.1 and 0.5 -> 3 of 4 pairs ordered; user 2: a tie -> 0.5.
    assert auc == {1: 0.75, 2: 0.5}
