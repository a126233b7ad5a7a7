"""The day's Bag-of-Meaning codebooks: the residual quantiser fitted on the served embeddings (or continued from
the warm-started model's), its codes renamed to yesterday's ids, and the report of their usage and purity.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hir_model.data import NeighbourhoodRows
from hir_model.quantiser import ResidualQuantiser, continue_codebooks, purity, quantiser_report
from jobs.common.errors import HirError
from jobs.train.continuity import align_quantiser
from jobs.train.inputs import TrainingInputs

# faiss trains k-means on at most 256 points per centroid (max_points_per_centroid): more adds time, not quality.
_POINTS_PER_CODE = 256
# One warm day's step on the same backfill (days 2 and 3, stickiness 1): yesterday's codebooks, 1.22 / 1.16 times
# a refit's reconstruction error on the day, kept level-0 for 1.000 / 0.973 of the unchanged items (refit: 0.733 /
# 0.757).
DEFAULT_CODEBOOK_TOLERANCE = 1.25


def quantise_day(
    embeddings: torch.Tensor,
    rows: NeighbourhoodRows,
    inputs: TrainingInputs,
    levels: int,
    codes_per_level: int | None,
    seed: int,
    init: ResidualQuantiser | None = None,
    tolerance: float = DEFAULT_CODEBOOK_TOLERANCE,
) -> tuple[ResidualQuantiser, dict[str, Any]]:
    """Fit the BoM quantiser on the day's embeddings (from `init`'s codebooks when it has the same shape: the
    warm-started model's: the closest to `init`'s within `tolerance` of a refit, hir_model.quantiser.continue_codebooks),
    rename its codes to yesterday's ids (jobs.train.continuity), and report usage, entropy,
    collisions (all entities and per type), the purity of the items' level-0 codes against their categories (with
    a shuffled-label chance level) and the share of entities that kept their code ids."""
    n = embeddings.shape[0]
    # A warm start keeps yesterday's codebook size, so its codes can carry over; else min(256, sqrt(N)).
    codes = codes_per_level or (
        init.codes_per_level
        if init is not None and init.levels == levels and init.codes_per_level <= n
        else min(256, max(2, math.isqrt(n)))
    )
    if codes > n:
        raise HirError(f"--codes-per-level {codes} exceeds the {n} entities of the day")
    generator = torch.Generator().manual_seed(seed)
    sample = min(n, _POINTS_PER_CODE * codes)
    fit_rows = torch.randperm(n, generator=generator)[:sample].sort().values
    same_shape = (
        init is not None
        and init.codebooks is not None
        and tuple(init.codebooks.shape) == (levels, codes, embeddings.shape[1])
    )
    continuation: dict[str, Any] = {"codebooks": "fitted", "kept_error_ratio": None}
    if same_shape:
        assert init is not None
        quantiser, continuation = continue_codebooks(init, embeddings[fit_rows], embeddings, tolerance)
    else:
        quantiser = ResidualQuantiser(levels=levels, codes_per_level=codes, seed=seed).fit(
            embeddings[fit_rows]
        )
    quantiser, hard, alignment = align_quantiser(
        quantiser, quantiser.encode(embeddings), rows.node_id, inputs.previous_tokens
    )
    report: dict[str, Any] = {
        "levels": levels,
        "codes_per_level": codes,
        "fit_rows": sample,
        "seeded_from_warm_start": same_shape,
        # codebooks: fitted (cold), kept (yesterday's), anchored (refitted, pulled to yesterday's) or refitted;
        # error_ratio / kept_error_ratio: the chosen codebooks' / yesterday's error on the day over a refit's.
        **continuation,
        "alignment": alignment,
        **quantiser_report(hard, codes),
        "by_type": {},
    }
    for node_type in sorted(set(rows.node_type.tolist())):
        mask = torch.from_numpy(rows.node_type == node_type)
        report["by_type"][node_type] = {"entities": int(mask.sum()), **quantiser_report(hard[mask], codes)}
    item_rows = rows.index_of(inputs.category_items)
    found = item_rows >= 0
    if found.any():
        level0 = hard[torch.from_numpy(item_rows[found]), 0]
        labels = torch.from_numpy(inputs.category_ids[found])
        shuffled = labels[torch.randperm(len(labels), generator=generator)]
        report["item_category_purity"] = purity(level0, labels)
        report["item_category_purity_chance"] = purity(level0, shuffled)
        report["items_with_category"] = int(found.sum())
    return quantiser, report
