"""Top-K ranking metrics per user and percentile-bootstrap confidence intervals over users.

Relevance is binary: an item is relevant to a user when it is in the user's target set T.

* recall@K   = |top-K ∩ T| / |T|
* hit_rate@K = 1 if |top-K ∩ T| > 0 else 0
* ndcg@K     = DCG@K / IDCG@K, DCG@K = Σ_{rank r ≤ K, item relevant} 1 / log2(r + 1) (ranks 1-based),
               IDCG@K = Σ_{r=1}^{min(|T|, K)} 1 / log2(r + 1)

Users with an empty T are not evaluated. A user of `targets` missing from `ranked` (the method produced nothing
for them) scores 0 on every metric and still counts in the averages. A ranked list may be shorter than K. An item
repeated in a ranked list counts once, at its first rank; later copies are dropped and the items after them move
up, as they would in a deduplicated list shown to the user.

Confidence intervals resample users with replacement (percentile bootstrap); paired differences reuse the same
resampled users for both methods, so the shared per-user variance cancels.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

METRICS = ("recall", "ndcg", "hit_rate")
DEFAULT_KS = (10, 20, 50, 100)

# Index matrix plus gathered values cost 16 bytes per element; 4M elements keeps a chunk near 64 MB.
_BOOTSTRAP_CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class UserMetrics:
    """Per-user metric values: `values[name][i]` belongs to `users[i]`; names are like `recall@10`."""

    users: list
    values: dict[str, np.ndarray]

    @property
    def num_users(self) -> int:
        return len(self.users)


def _user_sort_key(user: Hashable) -> tuple:
    # Ids may be str or int (even mixed across sources): numbers first, then strings, each in natural order.
    if isinstance(user, int | np.integer):
        return (0, int(user), "")
    return (1, 0, str(user))


def _first_unique(items: Iterable, limit: int) -> list:
    """The first `limit` distinct items, in order of first occurrence."""
    seen: dict = {}
    for item in items:
        if item not in seen:
            seen[item] = None
            if len(seen) == limit:
                break
    return list(seen)


def per_user_metrics(
    ranked: Mapping[Hashable, Sequence | np.ndarray],
    targets: Mapping[Hashable, set],
    ks: Sequence[int] = DEFAULT_KS,
) -> UserMetrics:
    """Recall@K, NDCG@K and HitRate@K for every user of `targets` with a non-empty target set.

    Parameters
    ----------
    ranked : user -> item ids, best first (list or numpy array).
    targets : user -> set of relevant item ids.
    ks : cut-offs; each must be a positive integer.

    Returns users sorted (ints before strings) and one float64 array per `<metric>@<k>`.
    """
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    max_k = ks[-1]
    discounts = 1.0 / np.log2(np.arange(2, max_k + 2))  # discounts[r - 1] = 1 / log2(r + 1)
    ideal_dcg = np.cumsum(discounts)  # ideal_dcg[n - 1] = IDCG with n relevant items on top

    users = sorted((u for u, t in targets.items() if t), key=_user_sort_key)
    num_targets = np.array([len(targets[u]) for u in users], dtype=np.int64)
    is_hit = np.zeros((len(users), max_k))  # (U, max_k): 1 where the item at that rank is a target
    for row, user in enumerate(users):
        items = ranked.get(user)
        if items is None:
            continue
        if isinstance(items, np.ndarray):
            items = items.tolist()  # numpy scalars -> Python ids, so set membership compares like with like
        relevant = targets[user]
        top = _first_unique(items, max_k)
        is_hit[row, : len(top)] = [item in relevant for item in top]
    # in_top[r, j] = 1 if rank r + 1 is within ks[j]: one product gives every cut-off without (U, max_k) copies.
    in_top = (np.arange(max_k)[:, None] < np.asarray(ks)[None, :]).astype(np.float64)  # (max_k, len(ks))
    hits = is_hit @ in_top  # (U, len(ks))
    dcg = is_hit @ (in_top * discounts[:, None])
    idcg = ideal_dcg[np.minimum(num_targets[:, None], np.asarray(ks)[None, :]) - 1]

    values: dict[str, np.ndarray] = {}
    for col, k in enumerate(ks):
        values[f"recall@{k}"] = hits[:, col] / np.maximum(num_targets, 1)
        values[f"ndcg@{k}"] = dcg[:, col] / idcg[:, col]
        values[f"hit_rate@{k}"] = (hits[:, col] > 0).astype(np.float64)
    return UserMetrics(users=users, values=values)


def _bootstrap_means(values: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """Means of `samples` resamples (with replacement) of `values`, drawn in chunks to bound memory."""
    n = len(values)
    rng = np.random.default_rng(seed)
    chunk = max(1, _BOOTSTRAP_CHUNK_ELEMENTS // n)
    means = np.empty(samples)
    for start in range(0, samples, chunk):
        stop = min(samples, start + chunk)
        index = rng.integers(0, n, size=(stop - start, n))  # (chunk, n)
        means[start:stop] = values[index].mean(axis=1)
    return means


def bootstrap_ci(
    values: np.ndarray | Sequence[float], *, samples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): the mean over users and its (1 - alpha) percentile-bootstrap interval.

    Deterministic for a given seed and number of users. Empty input gives (nan, nan, nan).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"expected one value per user, got shape {values.shape}")
    if len(values) == 0:
        return (float("nan"),) * 3
    if samples < 1 or not 0 < alpha < 1:
        raise ValueError(f"need samples >= 1 and 0 < alpha < 1, got {samples}, {alpha}")
    means = _bootstrap_means(values, samples, seed)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(values.mean()), float(low), float(high)


def paired_bootstrap_diff(
    a: np.ndarray | Sequence[float],
    b: np.ndarray | Sequence[float],
    *,
    samples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high) with both methods scored on the same resampled users.

    `a[i]` and `b[i]` must belong to the same user (e.g. `UserMetrics.values` from the same `targets`). The mean of
    a resample of differences equals the difference of the two resamples' means, so bootstrapping `a - b` is the
    paired bootstrap.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same users, got shapes {a.shape} and {b.shape}")
    return bootstrap_ci(a - b, samples=samples, alpha=alpha, seed=seed)


def summarise(
    user_metrics: UserMetrics, *, samples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> list[dict]:
    """One row per metric and K: `{metric, k, value, ci_low, ci_high, num_users}`, ordered recall, ndcg, hit_rate.

    Every metric uses the same seed, so all intervals come from the same resampled users.
    """
    parsed = []
    for name in user_metrics.values:
        metric, _, k = name.rpartition("@")
        if metric not in METRICS:
            raise ValueError(f"unknown metric {name!r}")
        parsed.append((METRICS.index(metric), int(k), metric, name))
    rows = []
    for _, k, metric, name in sorted(parsed):
        value, low, high = bootstrap_ci(user_metrics.values[name], samples=samples, alpha=alpha, seed=seed)
        rows.append(
            {
                "metric": metric,
                "k": k,
                "value": value,
                "ci_low": low,
                "ci_high": high,
                "num_users": user_metrics.num_users,
            }
        )
    return rows
