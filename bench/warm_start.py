"""Warm against cold starts, day by day: training time, validation recall and drift of two backfills of the same
days, one warm-starting each day from the day before (`hir pipeline`'s default), one cold.

    hir pipeline --ds-from 2026-01-01 --ds-to 2026-01-07 --source synthetic --config conf/pipeline/demo.toml \\
        --warehouse /tmp/warm
    hir pipeline --ds-from 2026-01-01 --ds-to 2026-01-07 --source synthetic --config conf/pipeline/demo.toml \\
        --warehouse /tmp/cold --stage-args train="--warm-start none"
    .venv/bin/python bench/warm_start.py /tmp/warm /tmp/cold

Per day: the train stage's seconds and steps (ratio warm / cold), the best validation recall@50 on the day's
held-out users (the same users in both runs: same data, same seed), and, per entity type, the drift figures among
the entities whose neighbourhood did not change (median cosine to the previous day, level-0 token kept,
overlap@10). Reads the warehouses' lineage records and `representation_drift` without Spark (deltalake).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from deltalake import DeltaTable


def train_days(warehouse: Path) -> dict[str, dict]:
    """ds -> the train stage's seconds, steps, warm start and best validation recall@50."""
    out = {}
    for record in sorted((warehouse / "_pipeline").glob("*.json")):
        train = json.loads(record.read_text())["stages"].get("train")
        if not train:
            continue
        metrics = (Path(train["artifact"]) / "metrics.jsonl").read_text().splitlines()
        summary = json.loads(metrics[-1])
        best = summary.get("best_validation") or {}
        out[record.stem] = {
            "seconds": train["seconds"],
            "steps": summary["steps"],
            "warm": summary.get("warm_start"),
            "recall": best.get("recall_at_50"),
            "kept": (summary["quantiser"].get("alignment") or {}).get("code_kept"),
        }
    return out


def drift_rows(warehouse: Path) -> dict[tuple[str, str], dict]:
    """(ds, entity_type) -> the unchanged cohort's drift row."""
    path = warehouse / "representation_drift"
    if not path.is_dir():
        return {}
    frame = DeltaTable(str(path)).to_pandas()
    frame = frame[frame["cohort"] == "unchanged"]
    return {(str(r["ds"]), r["entity_type"]): r for r in frame.to_dict("records")}


def _f(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("warm", type=Path, help="warehouse of the warm-started backfill")
    p.add_argument("cold", type=Path, help="warehouse of the cold-started backfill of the same days")
    args = p.parse_args()
    warm, cold = train_days(args.warm), train_days(args.cold)
    print("day         train s warm / cold (ratio)   steps warm / cold   val recall@50 warm / cold")
    totals = [0.0, 0.0]
    for ds in sorted(set(warm) & set(cold)):
        w, c = warm[ds], cold[ds]
        totals[0] += w["seconds"]
        totals[1] += c["seconds"]
        ratio = w["seconds"] / c["seconds"] if c["seconds"] else float("nan")
        print(
            f"{ds}  {w['seconds']:8.1f} / {c['seconds']:8.1f} ({ratio:4.2f})   {w['steps']:5d} / {c['steps']:5d}"
            f"        {_f(w['recall'])} / {_f(c['recall'])}"
            + ("" if w["warm"] else "   (first day: both cold)")
        )
    if totals[1]:
        print(f"total       {totals[0]:8.1f} / {totals[1]:8.1f} ({totals[0] / totals[1]:4.2f})")
    dw, dc = drift_rows(args.warm), drift_rows(args.cold)
    print(
        "\nunchanged neighbourhoods: median cosine to the previous day | level-0 kept | overlap@10, warm / cold"
    )
    for key in sorted(set(dw) | set(dc)):
        w, c = dw.get(key, {}), dc.get(key, {})
        print(
            f"{key[0]} {key[1]:<10} n={w.get('entities', c.get('entities', 0)):6d}  "
            f"cosine {_f(w.get('cosine_p50'))} / {_f(c.get('cosine_p50'))}  "
            f"level-0 {_f(w.get('level0_kept'))} / {_f(c.get('level0_kept'))}  "
            f"overlap {_f(w.get('overlap_at_10'))} / {_f(c.get('overlap_at_10'))}"
        )


if __name__ == "__main__":
    main()
