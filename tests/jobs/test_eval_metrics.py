"""Ranking metrics on hand-computed cases, and the bootstrap intervals' behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jobs.eval.metrics import UserMetrics, bootstrap_ci, paired_bootstrap_diff, per_user_metrics, summarise

LOG2_3 = math.log2(3)
LOG2_5 = math.log2(5)


def one_user(ranked: list, targets: set, ks=(2, 4)) -> dict[str, float]:
    metrics = per_user_metrics({"u": ranked}, {"u": targets}, ks=ks)
    return {name: float(values[0]) for name, values in metrics.values.items()}


def test_hand_computed_recall_hit_rate_ndcg():
    m = one_user(["a", "b", "c", "d"], {"b", "d"})
    assert m["recall@2"] == pytest.approx(0.5)
    assert m["hit_rate@2"] == 1.0
    assert m["ndcg@2"] == pytest.approx((1 / LOG2_3) / (1 + 1 / LOG2_3))
    assert m["recall@4"] == pytest.approx(1.0)
    assert m["hit_rate@4"] == 1.0
    assert m["ndcg@4"] == pytest.approx((1 / LOG2_3 + 1 / LOG2_5) / (1 + 1 / LOG2_3))


def test_no_hit_in_top_k_scores_zero_but_later_hit_counts():
    m = one_user(["a", "c", "b"], {"b"}, ks=(2, 3))
    assert (m["recall@2"], m["hit_rate@2"], m["ndcg@2"]) == (0.0, 0.0, 0.0)
    assert m["recall@3"] == 1.0
    assert m["ndcg@3"] == pytest.approx(1 / 2)  # 1 / log2(4) over IDCG 1


def test_user_without_a_ranked_list_scores_zero_and_still_counts():
    metrics = per_user_metrics({"hit": ["x"]}, {"hit": {"x"}, "missing": {"y"}}, ks=(10,))
    assert metrics.users == ["hit", "missing"]
    assert metrics.values["recall@10"].tolist() == [1.0, 0.0]
    assert metrics.values["ndcg@10"].tolist() == [1.0, 0.0]
    assert metrics.values["hit_rate@10"].mean() == 0.5


def test_users_with_empty_targets_are_skipped():
    metrics = per_user_metrics({"a": ["x"], "b": ["x"]}, {"a": {"x"}, "b": set()}, ks=(10,))
    assert metrics.users == ["a"]
    assert metrics.num_users == 1


def test_k_larger_than_the_list():
    m = one_user(["a", "b"], {"b", "z"}, ks=(100,))
    assert m["recall@100"] == pytest.approx(0.5)
    assert m["ndcg@100"] == pytest.approx((1 / LOG2_3) / (1 + 1 / LOG2_3))


def test_duplicates_count_once_at_their_first_rank():
    m = one_user(["b", "b", "a"], {"b"}, ks=(3,))
    assert m["recall@3"] == pytest.approx(1.0)  # not 2: the copy is not a second hit
    assert m["ndcg@3"] == pytest.approx(1.0)
    # Later copies are dropped and the items behind them move up: the deduplicated list is [b, d].
    m = one_user(["b", "b", "b", "d"], {"b", "d"}, ks=(2,))
    assert m["recall@2"] == pytest.approx(1.0)
    assert m["ndcg@2"] == pytest.approx(1.0)


def test_idcg_caps_at_k_when_there_are_more_targets_than_k():
    m = one_user(["a", "b", "x"], {"a", "b", "c", "d", "e"}, ks=(2,))
    assert m["recall@2"] == pytest.approx(2 / 5)
    assert m["ndcg@2"] == pytest.approx(1.0)  # IDCG@2 uses 2 positions, not 5


def test_numpy_arrays_and_int_ids():
    metrics = per_user_metrics({2: np.array([7, 8, 9]), 10: np.array([1])}, {10: {1}, 2: {9}}, ks=(2, 3))
    assert metrics.users == [2, 10]  # numeric order, not string order
    assert metrics.values["recall@2"].tolist() == [0.0, 1.0]
    assert metrics.values["recall@3"].tolist() == [1.0, 1.0]


def test_rejects_non_positive_k():
    with pytest.raises(ValueError):
        per_user_metrics({}, {"u": {"a"}}, ks=(0, 10))


def test_constant_values_give_a_zero_width_interval_at_the_value():
    mean, low, high = bootstrap_ci(np.full(500, 0.25), samples=200, seed=3)
    assert mean == pytest.approx(0.25)
    assert low == pytest.approx(0.25)
    assert high == pytest.approx(0.25)


def test_interval_contains_the_mean_and_narrows_with_more_users():
    rng = np.random.default_rng(1)
    few = rng.random(50)
    many = rng.random(5000)
    mean_few, low_few, high_few = bootstrap_ci(few, samples=500, seed=0)
    mean_many, low_many, high_many = bootstrap_ci(many, samples=500, seed=0)
    assert low_few < mean_few < high_few
    assert low_many < mean_many < high_many
    assert (high_many - low_many) < (high_few - low_few) / 4  # width shrinks like 1/sqrt(n): 10x here


def test_interval_is_close_to_the_normal_approximation():
    values = np.random.default_rng(2).random(2000)
    mean, low, high = bootstrap_ci(values, samples=2000, seed=0)
    half_width = 1.96 * values.std() / math.sqrt(len(values))
    assert high - mean == pytest.approx(half_width, rel=0.15)
    assert mean - low == pytest.approx(half_width, rel=0.15)


def test_same_seed_same_interval_different_seed_different_interval():
    values = np.random.default_rng(4).random(300)
    assert bootstrap_ci(values, seed=7) == bootstrap_ci(values, seed=7)
    assert bootstrap_ci(values, seed=7) != bootstrap_ci(values, seed=8)


def test_chunked_draws_cover_every_sample(monkeypatch):
    import jobs.eval.metrics as metrics_module

    monkeypatch.setattr(metrics_module, "_BOOTSTRAP_CHUNK_ELEMENTS", 7 * 100)  # 7 resamples per chunk
    values = np.random.default_rng(5).random(100)
    means = metrics_module._bootstrap_means(values, samples=50, seed=0)
    assert means.shape == (50,)
    assert np.all((means > 0) & (means < 1))  # no slot left uninitialised
    assert len(np.unique(means)) > 40


def test_empty_input_gives_nan():
    assert all(math.isnan(x) for x in bootstrap_ci(np.array([])))


def test_paired_difference_of_identical_arrays_is_exactly_zero():
    values = np.random.default_rng(6).random(400)
    assert paired_bootstrap_diff(values, values.copy()) == (0.0, 0.0, 0.0)


def test_paired_difference_is_tighter_than_unpaired_for_correlated_methods():
    rng = np.random.default_rng(8)
    base = rng.random(1000)
    better = base + 0.01 + rng.normal(0, 0.001, size=1000)
    diff, low, high = paired_bootstrap_diff(better, base, seed=0)
    assert diff == pytest.approx(0.01, abs=1e-3)
    assert 0 < low < diff < high  # the lift is significant because per-user variance cancels
    _, low_a, high_a = bootstrap_ci(better, seed=0)
    assert high - low < (high_a - low_a) / 10


def test_paired_difference_rejects_different_users():
    with pytest.raises(ValueError):
        paired_bootstrap_diff(np.zeros(3), np.zeros(4))


def test_summarise_rows():
    metrics = per_user_metrics({"a": ["x", "y"], "b": ["y"]}, {"a": {"y"}, "b": {"z"}}, ks=(1, 2))
    rows = summarise(metrics, samples=100, seed=0)
    assert [(r["metric"], r["k"]) for r in rows] == [
        ("recall", 1),
        ("recall", 2),
        ("ndcg", 1),
        ("ndcg", 2),
        ("hit_rate", 1),
        ("hit_rate", 2),
    ]
    by_key = {(r["metric"], r["k"]): r for r in rows}
    assert by_key["recall", 2]["value"] == pytest.approx(0.5)
    assert by_key["ndcg", 2]["value"] == pytest.approx(0.5 / LOG2_3)
    assert by_key["recall", 1]["value"] == 0.0
    assert all(r["num_users"] == 2 for r in rows)
    assert all(r["ci_low"] <= r["value"] <= r["ci_high"] for r in rows)
    assert set(rows[0]) == {"metric", "k", "value", "ci_low", "ci_high", "num_users"}


def test_summarise_rejects_unknown_metric_names():
    with pytest.raises(ValueError):
        summarise(UserMetrics(users=["a"], values={"precision@10": np.ones(1)}))
