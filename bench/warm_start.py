"""Warm against cold starts, day by day: training time, validation recall and drift of two backfills of the same
days, one warm-starting each day from the day before (`hir pipeline`'s default), one cold.

    hir pipeline --ds-from 2026-01-01 --ds-to 2026-01-07 --source synthetic --config conf/pipeline/demo.toml \\
        --warehouse /tmp/warm
    hir pipeline --ds-from 2026-01-01 --ds-to 2026-01-07 --source synthetic --config conf/pipeline/demo.toml \\
        --warehouse /tmp/cold --stage-args train="--warm-start none"
    .venv/bin/python bench/warm_start.py /tmp/warm /tmp/cold

Per day: the train stage's seconds and steps (ratio warm / cold), the best validation recall@50 on the day's
held-out end of the next period (the same engagements in both runs: same data, same settings), and, per entity
type, the drift figures among the entities whose neighbourhood did not change (median cosine to the previous day,
level-0 token kept, overlap@10).

Then the out-of-time comparison, paired over users: day d's published embeddings of each run rank every item of
day d for the users with a cart or purchase on day d + 1 (exact inner product, the events table's next day as
targets, restricted to items embedded on day d); Recall@50 and NDCG@50 per user of warm and cold, and the paired
bootstrap difference warm - cold with its 95% CI, per day and pooled over the days, on slice `all` and on
`new_interest` (targets the user had no event with up to day d) and `repeat` (the others). `--stages view` scores
the next day's views instead of its carts and purchases. The targets come after everything either model
saw, and both runs are scored on the same users and targets, so the difference is the warm start's alone.

Reads the warehouses' lineage records and tables without Spark (deltalake).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
from deltalake import DeltaTable

from jobs.eval.metrics import paired_bootstrap_diff, per_user_metrics
from jobs.eval.split import DEEP_STAGES
from jobs.index.build import exact_top_k
from schemas.codes import FUNNEL_STAGES

K = 50


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


def day_embeddings(warehouse: Path, ds: dt.date) -> dict[str, pd.DataFrame]:
    """entity type (user, item) -> raw_id-indexed frame of day `ds`'s vectors."""
    frame = DeltaTable(str(warehouse / "embeddings")).to_pandas(
        columns=["entity_type", "raw_id", "vector"], filters=[("ds", "=", ds)]
    )
    return {t: frame[frame["entity_type"] == t].set_index("raw_id") for t in ("user", "item")}


def next_day_targets(
    warehouse: Path, ds: dt.date, stages: tuple[str, ...] = DEEP_STAGES
) -> tuple[dict[str, set], dict[str, set]]:
    """(user -> items with an event of `stages` on ds + 1, user -> items the user had any event with up to ds)."""
    events = DeltaTable(str(warehouse / "events")).to_pandas(
        columns=["user_id", "item_id", "funnel_stage", "ds"],
        filters=[("ds", "<=", ds + dt.timedelta(days=1))],
    )
    later = events[(events["ds"] == ds + dt.timedelta(days=1)) & events["funnel_stage"].isin(stages)]
    seen = events[events["ds"] <= ds]
    targets = later.groupby("user_id")["item_id"].agg(set).to_dict()
    history = seen.groupby("user_id")["item_id"].agg(set).to_dict()
    return targets, history


def ranked_items(users: pd.DataFrame, items: pd.DataFrame, user_ids: list[str]) -> dict[str, list[str]]:
    """user -> its K items of highest inner product, best first (the index job's exact search)."""
    item_ids = items.index.to_numpy()
    _, positions = exact_top_k(
        np.stack(items["vector"].to_numpy()),
        np.arange(len(item_ids), dtype=np.int64),
        np.stack(users.loc[user_ids, "vector"].to_numpy()),
        min(K, len(item_ids)),
    )
    return {user: item_ids[row[row >= 0]].tolist() for user, row in zip(user_ids, positions, strict=True)}


def next_day_scores(
    warm: Path, cold: Path, ds: dt.date, stages: tuple[str, ...] = DEEP_STAGES
) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """slice -> metric -> (warm values, cold values), one per user of the slice, in the same user order."""
    targets, history = next_day_targets(warm, ds, stages)
    runs = [day_embeddings(warm, ds), day_embeddings(cold, ds)]
    known_items = set(runs[0]["item"].index) & set(runs[1]["item"].index)
    known_users = set(runs[0]["user"].index) & set(runs[1]["user"].index)
    slices = {
        "all": {u: t & known_items for u, t in targets.items() if u in known_users},
        "new_interest": {
            u: (t - history.get(u, set())) & known_items for u, t in targets.items() if u in known_users
        },
        "repeat": {
            u: t & history.get(u, set()) & known_items for u, t in targets.items() if u in known_users
        },
    }
    slices = {name: {u: t for u, t in slice_targets.items() if t} for name, slice_targets in slices.items()}
    if not slices["all"]:
        return {}  # no carts or purchases on ds + 1 (the log's last day)
    # Every slice's users are among slice `all`'s: rank them once per run.
    ranked = [ranked_items(run["user"], run["item"], sorted(slices["all"])) for run in runs]
    out = {}
    for name, slice_targets in slices.items():
        if not slice_targets:
            continue
        metrics = [per_user_metrics(r, slice_targets, ks=(K,)) for r in ranked]
        out[name] = {
            m: (metrics[0].values[f"{m}@{K}"], metrics[1].values[f"{m}@{K}"]) for m in ("recall", "ndcg")
        }
    return out


def print_next_day(warm: Path, cold: Path, days: list[str], stages: tuple[str, ...] = DEEP_STAGES) -> None:
    """Per day and pooled over the days (user-days: a user of several days counts once per day)."""
    print(
        f"\nnext day's {', '.join(stages)} ranked by day d's embeddings: Recall@{K} / NDCG@{K}, warm - cold [95% CI]"
    )
    pooled: dict[tuple[str, str], list[list[np.ndarray]]] = {}
    for day in days:
        ds = dt.date.fromisoformat(day)
        for name, metrics in next_day_scores(warm, cold, ds, stages).items():
            cells = []
            for metric, (a, b) in metrics.items():
                pooled.setdefault((name, metric), [[], []])
                pooled[(name, metric)][0].append(a)
                pooled[(name, metric)][1].append(b)
                diff, low, high = paired_bootstrap_diff(a, b)
                cells.append(
                    f"{metric} {a.mean():.3f} / {b.mean():.3f} ({diff:+.3f} [{low:+.3f}, {high:+.3f}])"
                )
            print(f"{day} {name:<12} users {len(a):5d}  " + "  ".join(cells))
    for (name, metric), (a, b) in sorted(pooled.items()):
        a, b = np.concatenate(a), np.concatenate(b)
        diff, low, high = paired_bootstrap_diff(a, b)
        print(
            f"pooled     {name:<12} user-days {len(a):5d}  {metric} {a.mean():.3f} / {b.mean():.3f} "
            f"({diff:+.3f} [{low:+.3f}, {high:+.3f}])"
        )


def _f(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("warm", type=Path, help="warehouse of the warm-started backfill")
    p.add_argument("cold", type=Path, help="warehouse of the cold-started backfill of the same days")
    p.add_argument(
        "--stages",
        default=",".join(DEEP_STAGES),
        help="funnel stages of the next day's events that count as targets (default: %(default)s; e.g. view, to "
        "see whether a model that loses on the deep stages wins on the plentiful ones)",
    )
    args = p.parse_args()
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    if not stages or not set(stages) <= set(FUNNEL_STAGES):
        p.error(f"--stages: choose from {', '.join(FUNNEL_STAGES)}")
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
    print_next_day(args.warm, args.cold, sorted(set(warm) & set(cold)), stages)


if __name__ == "__main__":
    main()
