"""Bag-of-Meaning tokens: residual k-means over embeddings, coarse (level 0) to fine.

Level 0 clusters the embeddings; level l clusters what levels < l left unexplained (the residual). An entity's
exact path is its hard code per level; its bag is the top-n codes per level with soft weights. The weights' softmax
temperature is calibrated per level at fit time (the median gap between a point's nearest and second-nearest
centroid), so a typical entity weighs its own code e times its runner-up, a borderline one near evenly, and a
bag's weights say how firmly the entity sits in each token: affinity, not a fixed near-uniform split.
Metrics say whether the codebooks are healthy: usage, entropy, collision rate of full paths, and purity against
known labels (planted clusters, categories).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

_CHUNK_ROWS = 65_536  # distance matrices are computed in row chunks: 65k x 256 floats = 64 MB
# Temperature of a quantiser saved before calibration existed (its state has no temperatures): 0.1 on unit vectors.
LEGACY_TEMPERATURE = 0.1


def squared_distances(points: Tensor, centroids: Tensor) -> Tensor:
    """(N, K) squared Euclidean distances, computed in row chunks to bound memory."""
    centroid_sq = (centroids * centroids).sum(dim=1)  # (K,)
    chunks = []
    for start in range(0, points.shape[0], _CHUNK_ROWS):
        chunk = points[start : start + _CHUNK_ROWS]
        dist = (chunk * chunk).sum(dim=1, keepdim=True) - 2.0 * chunk @ centroids.T + centroid_sq[None, :]
        chunks.append(dist.clamp_min_(0.0))
    return torch.cat(chunks) if chunks else points.new_zeros(0, centroids.shape[0])


def kmeans_plus_plus(points: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; scikit-learn's default): each new centroid is the best
    of 2 + ln(k) candidates drawn proportionally to squared distance. The draws come from a seeded CPU generator,
    so the seeds are the same on CPU and GPU."""
    trials = 2 + int(math.log(k))  # scikit-learn's n_local_trials
    first = int(torch.randint(points.shape[0], (1,), generator=generator))
    centroids = [points[first]]
    closest = squared_distances(points, points[first : first + 1])[:, 0]  # (N,)
    for _ in range(1, k):
        weights = closest.double().cpu()
        if float(weights.sum()) <= 0.0:  # every point already sits on a centroid (duplicates)
            weights = torch.ones_like(weights)
        candidates = torch.multinomial(weights, trials, replacement=True, generator=generator).to(
            points.device
        )
        with_candidate = torch.minimum(
            closest[None, :], squared_distances(points[candidates], points)
        )  # (T, N)
        best = int(with_candidate.sum(dim=1).argmin())
        centroids.append(points[candidates[best]])
        closest = with_candidate[best]
    return torch.stack(centroids)


def kmeans(
    points: Tensor,
    k: int,
    iters: int,
    generator: torch.Generator,
    init: Tensor | None = None,
    pull: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Lloyd's k-means from `init` (K, D) when given (yesterday's codebook: codes keep their place), else from
    k-means++ seeds. Returns centroids (K, D) and assignments (N,).

    pull > 0 (needs `init`) anchors each centroid to its init: the update is (sum of members + pull * init) /
    (members + pull), the mean under a prior worth `pull` points sitting at yesterday's centroid (the form of
    VQ-VAE's EMA codebook update). 0 is plain Lloyd; as pull grows the codebook tends to `init` itself."""
    if pull < 0 or (pull > 0 and init is None):
        raise ValueError(f"pull must be >= 0 and needs init centroids, got {pull}")
    anchor = init.to(points) if init is not None else None
    centroids = anchor if anchor is not None else kmeans_plus_plus(points, k, generator)
    assign = squared_distances(points, centroids).argmin(dim=1)
    for _ in range(iters):
        sums = torch.zeros_like(centroids).index_add_(0, assign, points)
        counts = torch.bincount(assign, minlength=k).to(points.dtype)
        if pull > 0:
            assert anchor is not None
            centroids = (sums + pull * anchor) / (counts + pull)[:, None]
        else:
            # An emptied cluster keeps its old centroid (deterministic, and it may win points back next round).
            centroids = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centroids)
        new_assign = squared_distances(points, centroids).argmin(dim=1)
        if torch.equal(new_assign, assign):
            break
        assign = new_assign
    return centroids, assign


class ResidualQuantiser:
    """Residual k-means with `levels` codebooks of `codes_per_level` codes each."""

    def __init__(self, levels: int = 3, codes_per_level: int = 256, iters: int = 25, seed: int = 0) -> None:
        # 3 x 256: 16.7M distinct paths, coarse level readable by analysts (RQ-VAE/TIGER semantic ids use 3 x 256).
        if levels < 1 or codes_per_level < 2:
            raise ValueError("need levels >= 1 and codes_per_level >= 2")
        self.levels = levels
        self.codes_per_level = codes_per_level
        self.iters = iters  # Lloyd converges in tens of iterations on unit vectors; 25 is enough for codes
        self.seed = seed
        self.codebooks: Tensor | None = None  # (levels, K, D)
        self.temperatures: Tensor | None = None  # (levels,) calibrated at fit; None: LEGACY_TEMPERATURE

    def _require_fit(self) -> Tensor:
        if self.codebooks is None:
            raise RuntimeError("ResidualQuantiser is not fitted: call fit() or load() first")
        return self.codebooks

    def fit(
        self, embeddings: Tensor, init: ResidualQuantiser | None = None, pull: float = 0.0
    ) -> ResidualQuantiser:
        """Learn the codebooks level by level on (N, D) embeddings. `init`, a fitted quantiser of the same shape
        (yesterday's, when the encoder was warm-started from yesterday's), seeds Lloyd's iterations at its codebooks,
        so a code keeps its meaning where the data did not move; without it, k-means++ seeds. `pull` (with `init`)
        anchors every level's centroids to init's, in points per code (see kmeans)."""
        if embeddings.ndim != 2 or embeddings.shape[0] < self.codes_per_level:
            raise ValueError(
                f"need an (N, D) matrix with N >= codes_per_level={self.codes_per_level}, got {tuple(embeddings.shape)}"
            )
        seeds = init.codebooks if init is not None else None
        if seeds is not None and tuple(seeds.shape) != (
            self.levels,
            self.codes_per_level,
            embeddings.shape[1],
        ):
            raise ValueError(
                f"init codebooks have shape {tuple(seeds.shape)}, this quantiser needs "
                f"{(self.levels, self.codes_per_level, embeddings.shape[1])}"
            )
        generator = torch.Generator().manual_seed(self.seed)
        residual = embeddings.detach().float()
        codebooks, temperatures = [], []
        for level in range(self.levels):
            centroids, assign = kmeans(
                residual,
                self.codes_per_level,
                self.iters,
                generator,
                seeds[level] if seeds is not None else None,
                pull,
            )
            codebooks.append(centroids)
            temperatures.append(calibrated_temperature(residual, centroids))
            residual = residual - centroids[assign]
        self.codebooks = torch.stack(codebooks)
        self.temperatures = torch.tensor(temperatures, dtype=torch.float32)
        return self

    def encode(self, embeddings: Tensor) -> Tensor:
        """Hard codes (N, levels): each entity's exact path."""
        return self.bag(embeddings, top_n=1)[0][:, :, 0]

    def level_temperatures(self, temperature: float | None = None) -> list[float]:
        """The softmax temperature of each level: `temperature` when given, else the calibrated ones."""
        if temperature is not None:
            return [float(temperature)] * self.levels
        if self.temperatures is None:
            return [LEGACY_TEMPERATURE] * self.levels
        return [float(t) for t in self.temperatures]

    def bag(
        self,
        embeddings: Tensor,
        top_n: int = 3,
        temperature: float | None = None,
        previous: Tensor | None = None,
        stickiness: float = 0.0,
    ) -> tuple[Tensor, Tensor]:
        """Top-n codes per level and their weights, each (N, levels, top_n); weights sum to 1 per level.

        Weights: softmax of -squared distance / temperature between the level's residual and its codebook,
        restricted to the top-n codes and renormalised. Code [:, :, 0] is the hard code; the residual for the next
        level follows the hard path. temperature None: each level's calibrated one (see calibrated_temperature).

        previous (N, levels'): each entity's hard codes of yesterday, in this quantiser's ids (-1 or >= K where it
        had none). With stickiness s > 0 an entity keeps yesterday's code at a level while that code's squared
        distance exceeds the nearest one's by at most s temperatures (hysteresis: an entity that sits near a
        boundary does not flip between two codes as the centroids move a little from day to day). The kept code
        is ranked first; the weights stay the affinities of the unboosted distances, so a kept code can weigh a
        little less than its runner-up.
        """
        codebooks = self._require_fit().to(embeddings.device)
        top_n = min(top_n, self.codes_per_level)
        residual = embeddings.detach().float()
        if previous is not None and previous.shape[0] != residual.shape[0]:
            raise ValueError(f"previous codes have {previous.shape[0]} rows, embeddings {residual.shape[0]}")
        codes, weights = [], []
        temperatures = self.level_temperatures(temperature)
        for level, (centroids, level_temperature) in enumerate(zip(codebooks, temperatures, strict=True)):
            logits = -squared_distances(residual, centroids) / level_temperature  # (N, K)
            ranking = logits
            if previous is not None and stickiness > 0 and level < previous.shape[1]:
                old = previous[:, level].to(logits.device).long()
                valid = (old >= 0) & (old < self.codes_per_level)
                # In logit units a distance margin of s temperatures is a bonus of s on yesterday's code.
                bonus = torch.zeros_like(logits)
                bonus[valid, old[valid]] = stickiness
                ranking = logits + bonus
            top_codes = ranking.topk(top_n, dim=1).indices  # sorted, strongest (or kept) first
            codes.append(top_codes)
            weights.append(torch.softmax(logits.gather(1, top_codes), dim=1))
            residual = residual - centroids[top_codes[:, 0]]
        return torch.stack(codes, dim=1), torch.stack(weights, dim=1)

    def reconstruct(self, codes: Tensor) -> Tensor:
        """(N, D) sum of the chosen centroid of every level."""
        codebooks = self._require_fit().to(codes.device)
        return sum(codebooks[level][codes[:, level]] for level in range(self.levels))

    def reconstruction_error(self, embeddings: Tensor, codes: Tensor | None = None) -> float:
        """Mean squared distance of each (N, D) embedding to the reconstruction of its path: `codes` (N, levels)
        when given (e.g. paths kept by hysteresis), else its nearest path."""
        embeddings = embeddings.detach().float()
        codes = self.encode(embeddings) if codes is None else codes
        return float(((embeddings - self.reconstruct(codes)) ** 2).sum(dim=1).mean())

    def permuted(self, perms: list[Tensor]) -> ResidualQuantiser:
        """A copy whose level-l code j is renamed perms[l][j] (each a permutation of range(K)). Renaming codes
        changes no assignment, residual or weight: only the ids the tokens carry."""
        codebooks = self._require_fit()
        if len(perms) != self.levels:
            raise ValueError(f"need {self.levels} permutations, got {len(perms)}")
        renamed = torch.empty_like(codebooks)
        for level, perm in enumerate(perms):
            perm = torch.as_tensor(perm, dtype=torch.long)
            if not torch.equal(perm.sort().values, torch.arange(self.codes_per_level)):
                raise ValueError(f"level {level}: not a permutation of range({self.codes_per_level})")
            renamed[level][perm] = codebooks[level]
        out = ResidualQuantiser(self.levels, self.codes_per_level, self.iters, self.seed)
        out.codebooks, out.temperatures = renamed, self.temperatures
        return out

    def state_dict(self) -> dict[str, Tensor | int]:
        state = {
            "codebooks": self._require_fit().cpu(),
            "levels": self.levels,
            "codes_per_level": self.codes_per_level,
            "iters": self.iters,
            "seed": self.seed,
        }
        if self.temperatures is not None:
            state["temperatures"] = self.temperatures.cpu()
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor | int]) -> ResidualQuantiser:
        quantiser = cls(
            int(state["levels"]), int(state["codes_per_level"]), int(state["iters"]), int(state["seed"])
        )
        codebooks = state["codebooks"]
        expected = (quantiser.levels, quantiser.codes_per_level)
        if not isinstance(codebooks, Tensor) or codebooks.ndim != 3 or tuple(codebooks.shape[:2]) != expected:
            raise ValueError(f"quantiser codebooks must have shape {expected} + (D,)")
        quantiser.codebooks = codebooks.float()
        temperatures = state.get("temperatures")
        if temperatures is not None:
            if not isinstance(temperatures, Tensor) or tuple(temperatures.shape) != (quantiser.levels,):
                raise ValueError(f"quantiser temperatures must have shape ({quantiser.levels},)")
            quantiser.temperatures = temperatures.float()
        return quantiser

    def save(self, path: str | Path) -> None:
        torch.save(self.state_dict(), path)

    @classmethod
    def load(cls, path: str | Path) -> ResidualQuantiser:
        return cls.from_state_dict(torch.load(path, map_location="cpu", weights_only=True))


# The pulls continue_codebooks tries, most anchored first, in mean cluster sizes (N / K points per code): at 16 a
# code's prior outweighs its members 16 to 1 on average; at 0.25 the members dominate. Its ladder's ends are
# yesterday's codebooks as they are and a plain refit.
ANCHOR_PULLS = (16.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.25)


def continue_codebooks(
    previous: ResidualQuantiser, fit_points: Tensor, embeddings: Tensor, tolerance: float
) -> tuple[ResidualQuantiser, dict[str, float | str | None]]:
    """Today's codebooks on a warm start: the ones closest to yesterday's whose reconstruction error on `embeddings`
    is at most `tolerance` times a plain refit's (Lloyd from yesterday's codebooks on `fit_points`).

    A refit moves every centroid, and an entity whose vector did not move then crosses a code boundary and changes
    token. So the candidates are tried from the most stable down: yesterday's `previous` unchanged (its ids,
    centroids and temperatures), then refits whose centroids are anchored to yesterday's (kmeans' pull) from
    ANCHOR_PULLS[0] to ANCHOR_PULLS[-1] mean cluster sizes, then the plain refit. The first within tolerance wins:
    the codes move only as far as the day's data needs for the fidelity asked (1: no worse than a refit).

    Returns the quantiser and a report: codebooks (kept, anchored or refitted), anchor_pull (mean cluster sizes,
    for anchored), error_ratio (the chosen one's error / the refit's) and kept_error_ratio (yesterday's / the
    refit's)."""
    if not tolerance >= 1.0:
        raise ValueError(f"tolerance must be >= 1, got {tolerance}")
    if previous.codebooks is None or tuple(previous.codebooks.shape[1:]) != (
        previous.codes_per_level,
        fit_points.shape[1],
    ):
        raise ValueError("continue_codebooks needs a fitted quantiser of the embeddings' dimension")

    def refit(pull: float) -> ResidualQuantiser:
        return ResidualQuantiser(
            previous.levels, previous.codes_per_level, previous.iters, previous.seed
        ).fit(fit_points, init=previous, pull=pull)

    plain = refit(0.0)
    refit_error = plain.reconstruction_error(embeddings)

    def ratio_of(quantiser: ResidualQuantiser) -> float:
        return quantiser.reconstruction_error(embeddings) / refit_error if refit_error > 0 else 1.0

    kept_ratio = ratio_of(previous)
    report: dict[str, float | str | None] = {"kept_error_ratio": kept_ratio, "anchor_pull": None}
    if kept_ratio <= tolerance:
        return previous, {**report, "codebooks": "kept", "error_ratio": kept_ratio}
    mean_size = fit_points.shape[0] / previous.codes_per_level
    for pull in ANCHOR_PULLS:
        candidate = refit(pull * mean_size)
        ratio = ratio_of(candidate)
        if ratio <= tolerance:
            return candidate, {**report, "codebooks": "anchored", "anchor_pull": pull, "error_ratio": ratio}
    return plain, {**report, "codebooks": "refitted", "error_ratio": 1.0}


def calibrated_temperature(points: Tensor, centroids: Tensor) -> float:
    """The median over points of (squared distance to the second-nearest centroid - to the nearest one).

    At this temperature the median point's nearest code outweighs its runner-up by a factor e: weights spread
    where points sit between codes and concentrate where they sit on one, at any embedding scale or level (residuals
    shrink level by level, so one fixed temperature would make fine levels uniform). Floored at 1e-6 for
    degenerate data (every point on a centroid)."""
    if points.shape[0] == 0 or centroids.shape[0] < 2:
        return LEGACY_TEMPERATURE
    nearest = squared_distances(points, centroids).topk(2, dim=1, largest=False).values  # (N, 2)
    return max(float((nearest[:, 1] - nearest[:, 0]).median()), 1e-6)


def code_usage(codes: Tensor, codes_per_level: int) -> list[float]:
    """Per level, the fraction of the codebook that some entity uses as its hard code."""
    return [codes[:, level].unique().numel() / codes_per_level for level in range(codes.shape[1])]


def code_entropy(codes: Tensor, codes_per_level: int) -> list[tuple[float, float]]:
    """Per level, (entropy in nats, entropy / ln K) of the hard-code distribution; 1.0 = perfectly even."""
    result = []
    for level in range(codes.shape[1]):
        probs = torch.bincount(codes[:, level], minlength=codes_per_level).double() / codes.shape[0]
        probs = probs[probs > 0]
        entropy = float(-(probs * probs.log()).sum())
        result.append((entropy, entropy / math.log(codes_per_level)))
    return result


def collision_rate(codes: Tensor) -> float:
    """Fraction of entities whose full path (all levels) is shared with at least one other entity."""
    if codes.shape[0] == 0:
        return 0.0
    _, inverse, counts = codes.unique(dim=0, return_inverse=True, return_counts=True)
    return float((counts[inverse] > 1).double().mean())


def purity(codes_level0: Tensor, labels: Tensor) -> float:
    """Share of entities whose label is the majority label of their level-0 code (1.0 = codes split by label)."""
    codes_level0, labels = torch.as_tensor(codes_level0).long(), torch.as_tensor(labels).long()
    if labels.numel() == 0:
        return 0.0
    code_values, code_index = codes_level0.unique(return_inverse=True)
    label_values, label_index = labels.unique(return_inverse=True)
    num_codes, num_labels = len(code_values), len(label_values)
    joint = torch.bincount(code_index * num_labels + label_index, minlength=num_codes * num_labels)
    return float(joint.view(num_codes, num_labels).max(dim=1).values.sum()) / labels.numel()


def quantiser_report(codes: Tensor, codes_per_level: int) -> dict[str, list[float] | float]:
    """Usage, entropy and collision metrics of hard codes (N, levels), JSON-ready."""
    entropy = code_entropy(codes, codes_per_level)
    return {
        "usage": code_usage(codes, codes_per_level),
        "entropy_nats": [nats for nats, _ in entropy],
        "entropy_normalised": [norm for _, norm in entropy],
        "collision_rate": collision_rate(codes),
    }


def code_alignment(new: Tensor, old: Tensor, codes_per_level: int) -> Tensor:
    """The renaming of today's codes that keeps most entities on yesterday's id: a permutation perm (K,) where
    perm[j] is the id today's code j takes. `new` and `old` are one level's codes of the entities present on both
    days. Maximum-weight matching of the K x K table of shared members (Hungarian, scipy's linear_sum_assignment):
    a code inherits the id of the old code it shares most members with, and codes that share none take the ids
    left over. Old codes >= K (a larger codebook yesterday) cannot be inherited: those tokens retire."""
    from scipy.optimize import linear_sum_assignment

    new, old = torch.as_tensor(new).long().cpu(), torch.as_tensor(old).long().cpu()
    if new.shape != old.shape:
        raise ValueError(f"new and old codes differ in shape: {tuple(new.shape)} vs {tuple(old.shape)}")
    k = codes_per_level
    keep = (old >= 0) & (old < k)
    shared = torch.bincount(new[keep] * k + old[keep], minlength=k * k).view(k, k)
    rows, cols = linear_sum_assignment(shared.numpy(), maximize=True)
    perm = torch.empty(k, dtype=torch.long)
    perm[torch.from_numpy(rows).long()] = torch.from_numpy(cols).long()
    return perm
