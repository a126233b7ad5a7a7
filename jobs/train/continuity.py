"""Day-to-day continuity of training: the model a day warm-starts from, and the token ids it keeps.

A ranking model trained on yesterday's features breaks silently when today's embedding axes or token ids mean
something else. Two things keep them: the encoder continues from yesterday's weights (`--warm-start`, chosen
here), and the day's quantiser codes are renamed to the ids that yesterday's `bom_tokens` gave the same entities
(`align_quantiser`: maximum-weight matching of shared members per level), so a token id keeps its meaning
whether or not the encoder was warm-started. The embed stage adds hysteresis (`previous_paths`): an entity
keeps yesterday's code while it is within a margin of the nearest one, so the centroids' small daily moves do not
flip the entities that sit near a boundary.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hir_model import storage
from hir_model.checkpoint import (
    WEIGHTS_FILE,
    ModelPath,
    is_complete,
    list_versions,
    model_path,
    published_at,
    read_lineage,
)
from hir_model.quantiser import ResidualQuantiser, code_alignment
from jobs.common.errors import HirError

WARM_NONE, WARM_PREVIOUS = "none", "previous"


def model_day(model_dir: str | Path) -> dt.date | None:
    """The ds a model version was trained for (its lineage), None when unreadable."""
    try:
        return dt.date.fromisoformat(read_lineage(model_dir)["ds"])
    except (OSError, ValueError, KeyError, TypeError, HirError):
        return None


def previous_model(models: str | Path, ds: dt.date) -> ModelPath | None:
    """The newest model version of the latest day before `ds` under `models` (ties: the newest folder)."""
    found = []
    for path in list_versions(models):
        day = model_day(path)
        if day is not None and day < ds:
            found.append((day, published_at(path), storage.name(path), path))
    return max(found)[-1] if found else None


def resolve_warm_start(value: str, models: str | Path, ds: dt.date) -> ModelPath | None:
    """--warm-start: none (cold), previous (the latest earlier day's model; cold, with a note, when there is none),
    a version name under --model-dir, or a model version folder (a path or URI)."""
    if value == WARM_NONE:
        return None
    if value == WARM_PREVIOUS:
        found = previous_model(models, ds)
        if found is None:
            print(
                f"note: --warm-start previous: no model of a day before {ds} under {models}; cold start",
                file=sys.stderr,
            )
        return found
    named = "/" in value or (storage.is_local(value) and Path(value).is_dir())
    path = model_path(value if named else storage.join(models, value))
    if not is_complete(path):
        raise HirError(f"--warm-start {value}: {path} is not a model version (no {WEIGHTS_FILE})")
    day = model_day(path)
    if day is not None and day >= ds:
        raise HirError(f"--warm-start {value}: that model was trained for {day}, not a day before {ds}")
    return path


@dataclass(frozen=True)
class PreviousTokens:
    """Yesterday's exact paths: per entity its hard code at each level (-1 where it had no token)."""

    ds: dt.date
    model_version: str
    node_id: np.ndarray  # (M,) int64, sorted
    codes: np.ndarray  # (M, levels) int64

    def identity(self) -> str:
        return f"{self.ds}/{self.model_version}"


def read_previous_tokens(spark, warehouse: str, ds: dt.date) -> PreviousTokens | None:
    """The exact paths `bom_tokens` holds for the latest day before `ds` (None when there is none). The code of
    level l is the last component of the level-l token ('L1:3.17' -> 17)."""
    from pyspark.sql import functions as F

    from jobs.common.delta import read_table, table_exists
    from schemas.tables import BOM_TOKENS

    if not table_exists(spark, BOM_TOKENS, warehouse):
        return None
    tokens = read_table(spark, BOM_TOKENS, warehouse).where((F.col("ds") < F.lit(ds)) & (F.col("rank") == 1))
    last = tokens.agg(F.max("ds")).first()[0]
    if last is None:
        return None
    day = tokens.where(F.col("ds") == F.lit(last))
    code = F.element_at(F.split(F.regexp_extract("token", r"^L[0-9]+:(.*)$", 1), r"\."), -1).cast("long")
    frame = day.select("node_id", "bom_level", code.alias("code"), "model_version").toPandas()
    if frame.empty:
        return None
    node_ids, position = np.unique(frame["node_id"].to_numpy(np.int64), return_inverse=True)
    levels = int(frame["bom_level"].max()) + 1
    codes = np.full((len(node_ids), levels), -1, dtype=np.int64)
    codes[position, frame["bom_level"].to_numpy(np.int64)] = frame["code"].to_numpy(np.int64)
    versions = sorted(set(frame["model_version"]))
    return PreviousTokens(last, ",".join(versions), node_ids, codes)


def align_quantiser(
    quantiser: ResidualQuantiser, hard: torch.Tensor, node_id: np.ndarray, previous: PreviousTokens | None
) -> tuple[ResidualQuantiser, torch.Tensor, dict[str, Any]]:
    """Rename each level's codes to the ids yesterday's tokens gave the most of the same entities.

    `hard` (N, levels) are today's codes of the entities `node_id`. Returns the renamed quantiser, the renamed
    codes and, per level, the share of the entities present both days whose code id equals yesterday's before
    and after the renaming."""
    if previous is None:
        return quantiser, hard, {"previous": None}
    order = np.argsort(node_id, kind="stable")
    at = np.searchsorted(previous.node_id, node_id[order])
    at = np.minimum(at, len(previous.node_id) - 1)
    found = previous.node_id[at] == node_id[order]
    today_rows = torch.from_numpy(order[found])
    before = previous.codes[at[found]]  # (S, previous levels)
    perms, kept_before, kept_after = [], [], []
    renamed = hard.clone()
    for level in range(quantiser.levels):
        new = hard[today_rows, level]
        if level < before.shape[1] and len(new):
            old = torch.from_numpy(before[:, level])
            perm = code_alignment(new, old, quantiser.codes_per_level)
            kept_before.append(float((new == old).double().mean()))
            kept_after.append(float((perm[new] == old).double().mean()))
        else:
            perm = torch.arange(quantiser.codes_per_level)
            kept_before.append(None)
            kept_after.append(None)
        perms.append(perm)
        renamed[:, level] = perm[hard[:, level]]
    report = {
        "previous": previous.identity(),
        "shared_entities": int(found.sum()),
        "code_kept_before_alignment": kept_before,
        "code_kept": kept_after,
    }
    return quantiser.permuted(perms), renamed, report


def aligned_day(model_dir: str | Path) -> dt.date | None:
    """The day whose `bom_tokens` ids the model's quantiser was renamed to (its training summary), None when the
    codes were not aligned (no earlier day, or hir train --no-align-tokens)."""
    from hir_model.checkpoint import read_summary

    summary = read_summary(model_dir)
    previous = ((summary.get("quantiser") or {}).get("alignment") or {}).get("previous")
    if not previous:
        return None
    try:
        return dt.date.fromisoformat(str(previous).split("/", 1)[0])
    except ValueError:
        return None


def previous_paths(spark, warehouse: str, ds: dt.date):
    """(node_id, previous_codes array<int>): each entity's exact path in `bom_tokens` on `ds`, None when that day
    has no tokens."""
    from pyspark.sql import functions as F

    from jobs.common.delta import read_table, table_exists
    from schemas.tables import BOM_TOKENS

    if not table_exists(spark, BOM_TOKENS, warehouse):
        return None
    day = read_table(spark, BOM_TOKENS, warehouse).where(
        (F.col("ds") == F.lit(ds)) & (F.col("rank") == 1) & (F.col("bom_level") == 0)
    )
    paths = day.select(
        "node_id", F.transform(F.split("path", r"\."), lambda c: c.cast("int")).alias("previous_codes")
    )
    return paths if paths.limit(1).count() else None
