"""hir evaluate end to end on a small synthetic log: no leakage, every method/slice/K, metrics that recompute; the
ranking task on the same source finds a signal planted in HIR's features only, and its folds never leak."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import FloatType, IntegerType, LongType, StringType, StructField, StructType

from jobs import evaluate as job
from jobs.common.delta import read_table, table_version
from jobs.common.errors import HirError
from jobs.eval import baselines as bl
from jobs.eval import features as fx
from jobs.eval import ranking as rk
from jobs.eval.metrics import per_user_metrics
from jobs.eval.split import temporal_split
from jobs.ingest_events import IngestConfig, ingest
from jobs.sources.synthetic import SyntheticSpec
from schemas.tables import EDGES, ENTITIES, EVAL_METRICS, EVENTS

TINY_TRAIN = "--epochs 2 --batch-size 64 --dim 16 --heads 2 --prototypes 16 --id-buckets 4096 --lr 3e-3"


def args(warehouse, *extra):
    return [
        "--warehouse",
        str(warehouse),
        "--protocol",
        "leave_last_conversion_out",
        "--stage-args",
        f"train={TINY_TRAIN}",
        "--stage-args",
        "enrich=--encoder hashing:32",
        "--als-grid",
        "rank=4;regParam=0.1;alpha=10",
        "--bootstrap",
        "50",
        *extra,
    ]


@pytest.fixture(scope="module")
def evaluated(spark, tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("eval") / "synthetic"
    spec = SyntheticSpec(users=120, items=200, events=4000, days=3, seed=3)
    ingest(spark, IngestConfig(source="synthetic", synthetic=spec, warehouse=str(warehouse)))
    cfg = job.config_from_args(args(warehouse))
    return warehouse, cfg, job.evaluate(spark, cfg)


@pytest.mark.slow
def test_no_target_or_later_event_reaches_the_history(spark, evaluated):
    warehouse, cfg, _ = evaluated
    split = job.make_split(spark, cfg)
    held = split.targets.join(
        read_table(spark, EVENTS, warehouse).where(F.col("funnel_stage").isin("cart", "purchase")),
        ["source", "user_id", "item_id"],
    )
    held_time = {
        r["user_id"]: r["t"] for r in held.groupBy("user_id").agg(F.max("event_time").alias("t")).collect()
    }
    assert held_time
    history = read_table(spark, EVENTS, cfg.history_warehouse).collect()
    assert all(r["event_time"] < held_time[r["user_id"]] for r in history if r["user_id"] in held_time)
    # ... and so nothing the graph (hence samples, training, baselines) saw is at or after a user's cut-off.
    node_of = {
        r["user_id"]: r["user"]
        for r in split.targets.select("user_id", bl.user_node().alias("user")).distinct().collect()
    }
    held_by_node = {node_of[u]: t for u, t in held_time.items()}
    edges = read_table(spark, EDGES, cfg.history_warehouse).where("src_type = 'user'").collect()
    users_in_graph = [r for r in edges if r["src"] in held_by_node]
    assert users_in_graph  # the held-out users are in the graph, with their earlier events only
    assert all(r["last_time"] < held_by_node[r["src"]] for r in users_in_graph)


@pytest.mark.slow
def test_every_method_slice_metric_and_k_is_written_with_a_ci(spark, evaluated):
    warehouse, cfg, report = evaluated
    everything = read_table(spark, EVAL_METRICS, warehouse).collect()
    assert len(everything) == len(report.rows)
    keys = {(r["method"], r["candidates"], r["slice"], r["metric"], r["k"]) for r in everything}
    assert len(keys) == len(everything)  # one row per key: nothing duplicated
    assert {r["task"] for r in everything} == {"retrieval", "ranking"}
    rows = [r for r in everything if r["task"] == "retrieval"]
    for method in job.METHODS:
        for metric in ("recall", "ndcg", "hit_rate"):
            for k in (10, 20, 50, 100):
                assert (method, "catalog", "all", metric, k) in keys
                assert (method, "graph", "all", metric, k) in keys
    # Every slice that has targets is reported (the synthetic log's conversions follow views of the same item,
    # so its last conversions may all be repeats and leave new_interest empty).
    data = job.collect_eval_data(
        spark, job.make_split(spark, cfg), bl.interactions(job.make_split(spark, cfg).history)
    )
    expected = {(c, s) for c in job.CANDIDATE_SETS for s in job.SLICES if job.slice_targets(data, c, s)}
    assert {(r["candidates"], r["slice"]) for r in rows} == expected and ("catalog", "all") in expected
    diffs = [r for r in rows if r["metric"] in ("hir_recall_diff", "hir_ndcg_diff")]
    for r in (r for r in rows if r not in diffs):
        assert 0.0 <= r["ci_low"] <= r["value"] + 1e-12 and r["value"] <= r["ci_high"] + 1e-12 <= 1.0 + 1e-12
        assert r["model_version"] == report.model_version and r["dataset"] == "synthetic"
    # HIR minus each baseline and each ablation, paired over the slice's users: the difference of the two methods'
    # own means.
    value = {(r["method"], r["candidates"], r["slice"], r["metric"], r["k"]): r["value"] for r in rows}
    assert {(r["method"], r["metric"]) for r in diffs} == {
        (b, f"hir_{m}_diff") for b in job.METHODS if b != "hir" for m in ("recall", "ndcg")
    }
    for r in diffs:
        metric, place = r["metric"].split("_")[1], (r["candidates"], r["slice"])
        expected = value[("hir", *place, metric, r["k"])] - value[(r["method"], *place, metric, r["k"])]
        assert r["value"] == pytest.approx(expected, abs=1e-12)
        assert r["ci_low"] - 1e-12 <= r["value"] <= r["ci_high"] + 1e-12 and -1.0 <= r["ci_low"]
    recall = {(r["method"], r["k"]): r["value"] for r in rows if r["metric"] == "recall" and r["slice"] == "all"
              and r["candidates"] == "catalog"}  # fmt: skip
    for method in job.METHODS:  # recall@K never falls as K grows
        values = [recall[(method, k)] for k in (10, 20, 50, 100)]
        assert values == sorted(values)
    assert Path(report.report_path).is_file() and "NDCG@50" in Path(report.report_path).read_text()
    assert (Path(report.report_path).parent / "recall_at_k.svg").is_file()


@pytest.mark.slow
def test_ranking_task_rows_are_bounded_by_the_candidates_and_lifts_pair_with_base(spark, evaluated):
    _, _, report = evaluated
    rows = {(r["method"], r["slice"], r["metric"], r["k"]): r for r in report.rows if r["task"] == "ranking"}
    union = rows[("candidate_union", "all", "recall", 50)]
    assert 0.0 < union["value"] <= 1.0
    for ranker in ("base", "base+hir_embedding", "base+hir_tokens", "base+hir"):
        ndcg = [rows[(ranker, "all", "ndcg", k)]["value"] for k in (10, 20, 50, 100)]
        assert all(0.0 <= v <= 1.0 for v in ndcg)
        recall = rows[(ranker, "all", "recall", 100)]
        # A ranker orders the candidates: it can never find a target the union does not hold.
        assert recall["value"] <= union["value"] + 1e-9 and recall["num_users"] == union["num_users"]
        assert 0.0 <= rows[(ranker, "all", "auc", 0)]["value"] <= 1.0
        if ranker != "base":
            lift = rows[(ranker, "all", "ndcg_lift", 10)]
            expected = rows[(ranker, "all", "ndcg", 10)]["value"] - rows[("base", "all", "ndcg", 10)]["value"]
            assert lift["value"] == pytest.approx(expected)
            assert lift["ci_low"] <= lift["value"] <= lift["ci_high"]
    purity = rows[("hir_tokens", "all", "level0_purity", 0)]["value"]
    assert 0.0 < purity <= 1.0
    text = Path(report.report_path).read_text()
    assert "Ranking task" in text and (Path(report.report_path).parent / "ranking_importance.svg").is_file()


@pytest.mark.slow
def test_popularity_metrics_recompute_from_the_history_by_hand(spark, evaluated):
    """The popularity row is recomputed with pandas from the history warehouse: counts of cart/purchase events."""
    warehouse, cfg, report = evaluated
    history = read_table(spark, EVENTS, cfg.history_warehouse).where(
        F.col("funnel_stage").isin("view", "favourite", "cart", "purchase")
    )
    ui = bl.interactions(history).toPandas()
    pop = ui.groupby("item").agg(deep=("deep", "sum"), weight=("weight", "sum")).reset_index()
    top = pop.sort_values(["deep", "weight", "item"], ascending=[False, False, True])["item"].to_numpy()[:10]
    split = job.make_split(spark, cfg)
    targets = split.targets.select(bl.user_node().alias("user"), bl.item_node().alias("item")).toPandas()
    seen_users = set(ui["user"].tolist())
    truth: dict[int, set[int]] = {}
    for user, item in zip(targets["user"], targets["item"], strict=True):
        if user in seen_users:
            truth.setdefault(int(user), set()).add(int(item))
    expected = per_user_metrics({u: top for u in truth}, truth, ks=(10,)).values["recall@10"].mean()
    row = report.value("popularity", "catalog", "all", "recall", 10)
    assert row is not None and row["value"] == pytest.approx(expected)
    assert row["num_users"] == len(truth)


@pytest.mark.slow
def test_a_rerun_reuses_every_history_stage_and_model_and_gives_the_same_numbers(spark, evaluated):
    warehouse, cfg, first = evaluated
    assert set(first.history_stages.values()) == {"ran"}  # the first run built the history
    history_version = table_version(spark, EVENTS, cfg.history_warehouse)
    again = job.evaluate(spark, cfg)
    assert (
        table_version(spark, EVENTS, cfg.history_warehouse) == history_version
    )  # split unchanged: not rewritten
    # ... so the history pipeline's lineage finds every stage fresh, and every model (ablations too) is reused.
    assert list(again.history_stages) == ["build-graph", "sample-neighbourhoods", "enrich", "train", "embed",
                                          "drift", "build-index"]  # fmt: skip
    assert set(again.history_stages.values()) == {"skipped"}
    assert again.models == first.models and set(again.models) == set(job.HIR_VARIANTS)
    rows = read_table(spark, EVAL_METRICS, warehouse).count()
    assert rows == len(first.rows) == len(again.rows)
    same = {(r["method"], r["candidates"], r["slice"], r["metric"], r["k"]): r["value"] for r in first.rows}
    assert {m for m in job.METHODS if m.startswith("hir")} <= {r["method"] for r in again.rows}
    for r in again.rows:  # every method, hir and its ablations included: same models, same numbers
        assert np.isclose(same[(r["method"], r["candidates"], r["slice"], r["metric"], r["k"])], r["value"])


def test_flag_errors_are_one_line(tmp_path):
    tmp_path.joinpath("wh").mkdir()
    wh = str(tmp_path / "wh")
    with pytest.raises(HirError, match="needs --cutoff"):
        job.config_from_args(["--warehouse", wh, "--protocol", "temporal"])
    with pytest.raises(HirError, match="time zone"):
        job.config_from_args(["--warehouse", wh, "--protocol", "temporal", "--cutoff", "2017-12-02T00:00:00"])
    llco = ["--protocol", "leave_last_conversion_out"]
    refused = [
        (["--warehouse", wh, *llco, "--methods", "hir,nope"], "unknown nope"),
        (["--warehouse", str(tmp_path / "none"), *llco], "warehouse not found"),
        (["--warehouse", wh, *llco, "--als-grid", "rank=4"], "--als-grid needs"),
        (["--warehouse", wh, *llco, "--dataset", "a'b"], "may not contain a quote"),
        (["--warehouse", wh, *llco, "--stage-args", "x=1"], "unknown stage 'x'"),
        (["--warehouse", wh, *llco, "--methods", "als"], "--task ranking needs hir"),
        (["--warehouse", wh, *llco, "--ranking-candidates", "0"], "--ranking-candidates must be at least 1"),
    ]
    for argv, message in refused:
        with pytest.raises(HirError, match=message):
            job.config_from_args(argv)
    only = job.config_from_args(["--warehouse", wh, *llco, "--methods", "als", "--task", "retrieval"])
    assert only.tasks == ("retrieval",)
    assert not list(tmp_path.joinpath("wh").iterdir())


# -- the ranking task on a planted signal ------------------------------------------------------------------------


RANKING_CANDIDATES = 40


def planted_bit(node: int) -> int:
    """A hidden side of every user and item: a hash of its node id, unrelated to anything in the events."""
    return int((node * 0x9E3779B97F4A7C15 >> 17) & 1)


@pytest.fixture(scope="module")
def planted(spark, evaluated):
    """The evaluated synthetic source's history and catalog (temporal cut at its last day); candidates drawn at
    random from the catalog; targets the candidates on the user's hidden side (a quarter of them); HIR's vectors and
    level-0 tokens carry the side, nothing else does."""
    warehouse, _, _ = evaluated
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
        chosen = rng.choice(items, size=RANKING_CANDIDATES, replace=False)
        lists[user], scores[user] = chosen, np.sort(rng.random(RANKING_CANDIDATES))[::-1].copy()
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
        RANKING_CANDIDATES,
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
        frame, runs, {"all": targets}, ks=(10, 50), per_generator=RANKING_CANDIDATES, samples=200, seed=0
    )
    at = {(r["method"], r["metric"], r["k"]): r for r in rows}
    for ranker in ("base+hir", "base+hir_embedding", "base+hir_tokens"):
        lift = at[(ranker, "ndcg_lift", 10)]
        assert lift["ci_low"] > 0.0, (ranker, lift)  # the planted side is found, with the CI above zero
    # Half of a user's candidates are on its side and half of those are targets: knowing the side doubles the
    # hit rate of a random order, so NDCG@10 must rise by far more than noise.
    assert at[("base+hir", "ndcg", 10)]["value"] > 1.5 * at[("base", "ndcg", 10)]["value"]
    assert at[("base+hir", "auc", 0)]["value"] > 0.7 > at[("base", "auc", 0)]["value"]
    assert at[("candidate_union", "recall", RANKING_CANDIDATES)]["value"] == pytest.approx(1.0)
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
