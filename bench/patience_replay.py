"""Early-stopping patience, replayed on finished trainings' validation histories: which model each patience would
have served, and after how many steps it would have stopped.

    .venv/bin/python bench/patience_replay.py warehouse /tmp/other-warehouse --patience 6 3 2

A training's trajectory does not depend on its patience (a validation draws no random numbers, and the schedules
are fixed by the step budget, not by when the run stops), so replaying a run's `metrics.jsonl` with a shorter
patience gives exactly the best step and the stop step that run would have had. A longer patience than the run
was trained with cannot be replayed past its last validation: such a row says `ran out` when the run had stopped
before that patience would have.

Per model folder (every `metrics.jsonl` under the given roots, finished versions and live run folders alike): cold
or warm, then for each patience the best validation recall@50, its step and the stop step; the last columns compare
each patience with the first one given (the baseline): the same served model or not, and the ratio of steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def validations(metrics: Path) -> list[tuple[int, float]]:
    """(step, validation recall@50) of every validation of the run, in order."""
    out = []
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if row.get("validation_recall_at_50") is not None and "step" in row:
            out.append((int(row["step"]), float(row["validation_recall_at_50"])))
    return out


def replay(history: list[tuple[int, float]], patience: int) -> tuple[float, int, int | None]:
    """(best recall, its step, the stop step) with `patience`: the run stops after `patience` validations without a
    better one, as jobs.train.run.EpochSelection does; stop None when the history ends first."""
    best, best_step, since = float("-inf"), -1, 0
    for step, recall in history:
        if recall > best:
            best, best_step, since = recall, step, 0
            continue
        since += 1
        if since >= patience:
            return best, best_step, step
    return best, best_step, None


def is_warm(metrics: Path) -> bool | None:
    config = metrics.parent / "config.json"
    if not config.exists():
        return None
    return bool(json.loads(config.read_text()).get("job", {}).get("warm_start"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path, help="folders searched for metrics.jsonl")
    parser.add_argument(
        "--patience", type=int, nargs="+", default=[6, 3, 2], help="the first is the baseline"
    )
    args = parser.parse_args()
    base, *others = args.patience
    same = {p: 0 for p in others}
    steps = {p: [0, 0] for p in others}
    runs = 0
    for root in args.roots:
        for metrics in sorted(root.rglob("metrics.jsonl")):
            history = validations(metrics)
            if not history:
                continue
            warm = is_warm(metrics)
            cells = []
            results = {p: replay(history, p) for p in args.patience}
            for p in args.patience:
                best, at, stop = results[p]
                cells.append(f"p{p}: {best:.3f} @ {at}, stop {'ran out' if stop is None else stop}")
            base_stop = results[base][2]
            for p in others:
                stop = results[p][2]
                agree = results[p][1] == results[base][1]
                same[p] += agree
                if base_stop is not None and stop is not None:
                    steps[p][0] += stop
                    steps[p][1] += base_stop
                cells.append(f"p{p} vs p{base}: {'same' if agree else 'DIFFERENT'}")
            runs += 1
            kind = {True: "warm", False: "cold", None: "?"}[warm]
            print(f"{metrics.parent}  [{kind}]  " + " | ".join(cells))
    for p in others:
        ratio = f"{steps[p][0] / steps[p][1]:.2f}" if steps[p][1] else "n/a"
        print(f"patience {p}: the same served model as {base} on {same[p]} of {runs} runs; steps {ratio}x")


if __name__ == "__main__":
    main()
