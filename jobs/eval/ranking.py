"""The ranking task: what HIR's embeddings and tokens add to a learning-to-rank model over a fixed candidate set.

A ranking team joins `embeddings` and `bom_tokens` to its candidates as features. This measures that use:

* Candidates per user: the union of the generators' top N (co-visitation, ALS, popularity, category
  popularity, HIR), the same for every ranker; label 1 where the item is one of the user's deep-funnel targets.
  The union's own recall is the ceiling every ranker shares.
* Rankers: LightGBM lambdarank (its native API; no scikit-learn) on four feature sets, `base` (what a team has
  without HIR, jobs.eval.features.BASE_GROUPS), `base+hir_embedding`, `base+hir_tokens` and `base+hir`.
* Folds: k folds over users (seeded permutation); a ranker scoring a fold was trained on the other folds' users
  only, so a user's targets never label a model that is tested on that user, and item identity is no feature.
  Inside the training users, a seeded 20% stops boosting (NDCG@10 without gain for 30 rounds): the only choice
  made from data, and never on the test fold. Every other hyper-parameter is fixed below, in advance.
* Metrics on the held-out folds: NDCG@K, Recall@K and HitRate@K of each ranker's order over the candidates
  (recall against all of the user's targets in the slice, so the union's recall bounds it), per-user AUC, and
  the paired bootstrap difference (over users) of each HIR ranker against `base`, per slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from jobs.common.errors import HirError
from jobs.eval.features import BASE_GROUPS
from jobs.eval.metrics import bootstrap_ci, paired_bootstrap_diff, per_user_metrics, summarise

RANKERS: dict[str, tuple[str, ...]] = {
    "base": BASE_GROUPS,
    "base+hir_embedding": (*BASE_GROUPS, "hir_embedding"),
    "base+hir_tokens": (*BASE_GROUPS, "hir_tokens"),
    "base+hir": (*BASE_GROUPS, "hir_embedding", "hir_tokens"),
}
FOLDS = 5
# Fixed in advance: LightGBM's usual lambdarank settings, shrunk for a few hundred to a few thousand users per
# training fold (15 leaves, 20 rows a leaf, row and feature bagging, mild L2).
LGB_PARAMS: dict[str, object] = {
    "objective": "lambdarank",
    "metric": "ndcg",
    "eval_at": [10],
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 20,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 1.0,
    "deterministic": True,
    "force_col_wise": True,
    "verbose": -1,
}
MAX_ROUNDS = 500
STOP_ROUNDS = 30
STOP_SHARE = 0.2  # of the training users, held out to stop boosting
FIXED_ROUNDS = 100  # when too few training users hold a target to hold some out
LIFT_METRICS = (("ndcg", 10), ("ndcg", 50), ("recall", 50))


@dataclass(frozen=True)
class FoldPlan:
    fold: int
    train_users: frozenset[int]  # fitted on (those with a target among their candidates)
    stop_users: frozenset[int]  # part of the training users, held out to stop boosting
    test_users: frozenset[int]  # scored by this fold's model, and by no other


@dataclass
class RankerRun:
    name: str
    features: list[str]
    # Aligned with the candidate frame's rows; each from the model of the fold the row's user is tested in.
    scores: np.ndarray
    gain: dict[str, float] = field(default_factory=dict)  # feature -> total gain over the folds
    rounds: list[int] = field(default_factory=list)  # boosting rounds kept per fold
    plans: list[FoldPlan] = field(default_factory=list)


def user_folds(users: Sequence[int], folds: int, seed: int) -> dict[int, int]:
    """user -> fold in [0, folds): a seeded permutation dealt round-robin (fold sizes differ by at most one)."""
    ordered = np.array(sorted({int(u) for u in users}), dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(ordered))
    return {int(ordered[i]): n % folds for n, i in enumerate(order)}


def _groups(users: np.ndarray) -> np.ndarray:
    """Group sizes of a user column sorted by user (LightGBM's query groups)."""
    _, counts = np.unique(users, return_counts=True)
    return counts


def fit_ranker(
    frame: pd.DataFrame,
    name: str,
    features: Sequence[str],
    folds_of: Mapping[int, int],
    *,
    folds: int = FOLDS,
    seed: int = 0,
    threads: int = 0,
) -> RankerRun:
    """Cross-fitted scores of one feature set over `frame` (user, item, label, features...), sorted by user."""
    import lightgbm as lgb

    users = frame["user"].to_numpy(np.int64)
    labels = frame["label"].to_numpy(np.float64)
    x = frame[list(features)].to_numpy(np.float64)
    fold_of_row = np.array([folds_of[int(u)] for u in users.tolist()])
    with_target = set(frame.loc[frame["label"] > 0, "user"].astype("int64").tolist())
    run = RankerRun(name, list(features), np.zeros(len(frame)))
    rng = np.random.default_rng(seed)
    params = {**LGB_PARAMS, "seed": seed, "num_threads": threads}
    gain = np.zeros(len(features))
    for fold in range(folds):
        test = fold_of_row == fold
        learn_users = sorted({u for u, f in folds_of.items() if f != fold} & with_target)
        stop_users = (
            set(
                rng.choice(
                    learn_users, size=max(1, round(STOP_SHARE * len(learn_users))), replace=False
                ).tolist()
            )
            if len(learn_users) >= 10
            else set()
        )
        plan = FoldPlan(
            fold,
            frozenset(learn_users),
            frozenset(stop_users),
            frozenset(int(u) for u in np.unique(users[test]).tolist()),
        )
        if plan.train_users & plan.test_users:  # the fold structure guarantees it; this says so loudly
            raise HirError(f"ranking fold {fold}: a user is both trained and tested on")
        run.plans.append(plan)
        if not test.any():
            continue
        if not learn_users:
            run.rounds.append(0)  # nobody to learn from: every candidate ties (ordered by item id)
            continue
        in_learn = np.isin(users, list(set(learn_users) - stop_users))
        train_set = lgb.Dataset(
            x[in_learn], labels[in_learn], group=_groups(users[in_learn]), free_raw_data=False
        )
        if stop_users:
            in_stop = np.isin(users, list(stop_users))
            stop_set = lgb.Dataset(
                x[in_stop], labels[in_stop], group=_groups(users[in_stop]), reference=train_set
            )
            booster = lgb.train(
                params,
                train_set,
                MAX_ROUNDS,
                valid_sets=[stop_set],
                callbacks=[lgb.early_stopping(STOP_ROUNDS, verbose=False)],
            )
            rounds = booster.best_iteration or MAX_ROUNDS
        else:
            booster = lgb.train(params, train_set, FIXED_ROUNDS)
            rounds = FIXED_ROUNDS
        run.rounds.append(int(rounds))
        run.scores[test] = booster.predict(x[test], num_iteration=rounds)
        gain += booster.feature_importance("gain", iteration=rounds)
    run.gain = dict(zip(features, gain.tolist(), strict=True))
    return run


def ranked_lists(frame: pd.DataFrame, scores: np.ndarray) -> dict[int, np.ndarray]:
    """user -> its candidates by score, best first (ties: smaller item id first)."""
    order = pd.DataFrame({"user": frame["user"], "item": frame["item"], "score": scores}).sort_values(
        ["user", "score", "item"], ascending=[True, False, True], kind="stable"
    )
    return {int(u): g["item"].to_numpy(np.int64) for u, g in order.groupby("user", sort=False)}


def per_user_auc(frame: pd.DataFrame, scores: np.ndarray, truth: Mapping[int, set]) -> dict[int, float]:
    """AUC of the scores among each user's candidates (users with a target and a non-target among them)."""
    out = {}
    table = pd.DataFrame({"user": frame["user"], "item": frame["item"], "score": scores})
    for user, group in table.groupby("user", sort=True):
        targets = truth.get(int(user))
        if not targets:
            continue
        positive = group["item"].isin(targets).to_numpy()
        n_pos, n_neg = int(positive.sum()), int((~positive).sum())
        if n_pos == 0 or n_neg == 0:
            continue
        ranks = group["score"].rank(method="average").to_numpy()  # Mann-Whitney U from the rank sum
        out[int(user)] = float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return out


def union_recall(frame: pd.DataFrame, truth: Mapping[int, set]) -> np.ndarray:
    """Per user of `truth` (sorted), the share of its targets among its candidates."""
    held = frame.groupby("user")["item"].apply(set).to_dict()
    return np.array([len(truth[u] & held.get(u, set())) / len(truth[u]) for u in sorted(truth)])


def group_importance(run: RankerRun, groups: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Feature group -> its share of the ranker's total gain (0 for a group the ranker does not use)."""
    total = sum(run.gain.values()) or 1.0
    return {
        group: sum(run.gain.get(f, 0.0) for f in columns) / total
        for group, columns in groups.items()
        if any(f in run.gain for f in columns)
    }


def _row(method: str, slice_: str, metric: str, k: int, value, low, high, users: int) -> dict:
    return {
        "task": "ranking",
        "method": method,
        "candidates": "union",
        "slice": slice_,
        "metric": metric,
        "k": int(k),
        "value": float(value),
        "ci_low": float(low),
        "ci_high": float(high),
        "num_users": int(users),
    }


def ranking_rows(
    frame: pd.DataFrame,
    runs: Mapping[str, RankerRun],
    truth_by_slice: Mapping[str, Mapping[int, set]],
    *,
    ks: Sequence[int],
    per_generator: int,
    samples: int,
    seed: int,
) -> list[dict]:
    """eval_metrics rows of the ranking task, every slice with targets among the evaluated users."""
    rows = []
    orders = {name: ranked_lists(frame, run.scores) for name, run in runs.items()}  # the same in every slice
    for slice_, truth in truth_by_slice.items():
        if not truth:
            continue
        recall = union_recall(frame, truth)
        rows.append(
            _row(
                "candidate_union",
                slice_,
                "recall",
                per_generator,
                *bootstrap_ci(recall, samples=samples, seed=seed),
                len(recall),
            )
        )
        per_user = {}
        for name, run in runs.items():
            per_user[name] = per_user_metrics(orders[name], truth, ks=ks)
            for summary in summarise(per_user[name], samples=samples, seed=seed):
                rows.append(
                    {"task": "ranking", "method": name, "candidates": "union", "slice": slice_, **summary}
                )
            auc = per_user_auc(frame, run.scores, truth)
            if auc:
                values = np.array([auc[u] for u in sorted(auc)])
                rows.append(
                    _row(
                        name, slice_, "auc", 0, *bootstrap_ci(values, samples=samples, seed=seed), len(values)
                    )
                )
        if "base" not in per_user:
            continue
        for name in per_user:
            if name == "base":
                continue
            for metric, k in LIFT_METRICS:
                if k not in ks:
                    continue
                key = f"{metric}@{k}"
                diff = paired_bootstrap_diff(
                    per_user[name].values[key], per_user["base"].values[key], samples=samples, seed=seed
                )
                rows.append(_row(name, slice_, f"{metric}_lift", k, *diff, per_user[name].num_users))
    return rows
