"""Hysteresis of the Bag-of-Meaning codes (`hir embed --stickiness`): per margin, how many entities keep
yesterday's level-0 token, and what the kept codes cost in fidelity, recomputed for every day of a backfill.

    hir pipeline --ds-from 2026-01-01 --ds-to 2026-01-07 --source synthetic --config conf/pipeline/demo.toml \\
        --warehouse /tmp/warm
    .venv/bin/python bench/sticky_codes.py /tmp/warm

For each day d whose model's codes were aligned to day d - 1's tokens: day d's published vectors (hysteresis does
not change them), day d's quantiser (the model its embeddings name) and day d - 1's published paths (the ids the
quantiser was aligned to). Each margin re-derives day d's paths from those, as `hir embed` does, and prints

* level-0 kept: the share of the entities of both days whose level-0 code is yesterday's, among the unchanged
  entities (the same neighbour ids in their sample on both days, `hir drift`'s cohort) and among all;
* off nearest: the share of entities whose level-0 code is not their nearest one (what the margin costs);
* error: the mean squared error of the full path's reconstruction against margin 0's (1.00 = no cost).

Each margin is computed twice: with the codebooks of day d's model (`day`: whatever its training chose, a refit or
yesterday's kept under `--codebook-tolerance`) and with those of day d - 1's model (`kept`: what keeping
yesterday's codebooks would have given that day), errors against the `day` codebooks' margin 0.

Margin 0 is the plain nearest code; the backfill's own margin shaped day d - 1's paths, so each row is one day's
step from the same yesterday, not a backfill run at that margin. Reads the tables without Spark (deltalake).
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from deltalake import DeltaTable

from hir_model.checkpoint import load_quantiser
from jobs.train.continuity import aligned_day

MARGINS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def read_day(warehouse: Path, table: str, ds: dt.date, columns: list[str]) -> pd.DataFrame:
    return DeltaTable(str(warehouse / table)).to_pandas(columns=columns, filters=[("ds", "=", ds)])


def signatures(warehouse: Path, ds: dt.date) -> pd.Series:
    """node_id -> the sorted neighbour ids of its sample (0 is padding), as `hir drift` compares them."""
    rows = read_day(warehouse, "neighbourhoods", ds, ["node_id", "token_node_id"])
    return pd.Series(
        [tuple(sorted(int(n) for n in ids if n != 0)) for ids in rows["token_node_id"]], index=rows["node_id"]
    )


def previous_codes(warehouse: Path, ds: dt.date, levels: int) -> pd.Series:
    """node_id -> its exact path on `ds` (level-0 rank-1 rows carry the whole path)."""
    tokens = read_day(warehouse, "bom_tokens", ds, ["node_id", "bom_level", "rank", "path"])
    tokens = tokens[(tokens["bom_level"] == 0) & (tokens["rank"] == 1)]
    return pd.Series(
        [[int(c) for c in p.split(".")][:levels] for p in tokens["path"]], index=tokens["node_id"]
    )


def sweep(warehouse: Path, ds: dt.date) -> list[dict] | None:
    today = read_day(warehouse, "embeddings", ds, ["node_id", "entity_type", "vector", "model_version"])
    if today.empty:
        return None
    model_dir = warehouse / "models" / str(today["model_version"].iloc[0])
    previous_day = aligned_day(model_dir)
    quantiser = load_quantiser(model_dir)
    if previous_day is None or quantiser is None:
        return None
    previous_model = read_day(warehouse, "embeddings", previous_day, ["model_version"])["model_version"].iloc[
        0
    ]
    kept = load_quantiser(warehouse / "models" / str(previous_model))
    yesterday = previous_codes(warehouse, previous_day, quantiser.levels)
    shared = today[today["node_id"].isin(yesterday.index)].reset_index(drop=True)
    old = torch.tensor(np.stack(yesterday.loc[shared["node_id"]].to_numpy()), dtype=torch.long)
    before, after = signatures(warehouse, previous_day), signatures(warehouse, ds)
    unchanged = np.array(
        [n in before.index and n in after.index and before[n] == after[n] for n in shared["node_id"]]
    )
    vectors = torch.from_numpy(np.stack(shared["vector"].to_numpy()).astype(np.float32))
    base_error = quantiser.reconstruction_error(vectors)
    out = []
    for name, codebooks in (("day", quantiser), ("kept", kept)):
        if codebooks is None or codebooks.codebooks.shape != quantiser.codebooks.shape:
            continue
        nearest = codebooks.encode(vectors)
        for margin in MARGINS:
            codes = codebooks.bag(vectors, top_n=1, previous=old, stickiness=margin)[0][:, :, 0]
            kept_code = (codes[:, 0] == old[:, 0]).numpy()
            error = codebooks.reconstruction_error(vectors, codes)
            out.append(
                {
                    "ds": str(ds),
                    "codebooks": name,
                    "margin": margin,
                    "unchanged": int(unchanged.sum()),
                    "shared": len(shared),
                    "kept_unchanged": float(kept_code[unchanged].mean()) if unchanged.any() else float("nan"),
                    "kept_all": float(kept_code.mean()),
                    "off_nearest": float((codes[:, 0] != nearest[:, 0]).double().mean()),
                    "error": error / base_error if base_error > 0 else 1.0,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("warehouse", type=Path)
    warehouse = parser.parse_args().warehouse
    days = sorted(
        DeltaTable(str(warehouse / "embeddings")).to_pandas(columns=["ds"])["ds"].drop_duplicates().tolist()
    )
    rows = [row for ds in days for row in (sweep(warehouse, ds) or [])]
    if not rows:
        raise SystemExit(f"no day under {warehouse} has a model aligned to an earlier day's tokens")
    frame = pd.DataFrame(rows)
    print("level-0 kept (unchanged / all entities of both days), off nearest, error vs margin 0, per day:")
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    pooled = (
        frame.assign(
            kept_unchanged_n=frame["kept_unchanged"].fillna(0) * frame["unchanged"],
            kept_all_n=frame["kept_all"] * frame["shared"],
            off_n=frame["off_nearest"] * frame["shared"],
        )
        .groupby(["codebooks", "margin"])[["kept_unchanged_n", "unchanged", "kept_all_n", "off_n", "shared"]]
        .sum()
    )
    print("\npooled over the days:")
    for (codebooks, margin), r in pooled.iterrows():
        print(
            f"  {codebooks:<4} margin {margin:<5} kept unchanged {r['kept_unchanged_n'] / max(r['unchanged'], 1):.3f} "
            f"({int(r['unchanged'])}), kept all {r['kept_all_n'] / r['shared']:.3f}, "
            f"off nearest {r['off_n'] / r['shared']:.3f}"
        )


if __name__ == "__main__":
    main()
