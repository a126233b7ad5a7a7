"""build-graph and sample-neighbourhoods at 1x, 4x and 16x events: does their cost grow at most linearly?

    .venv/bin/python bench/graph_scaling.py                          # 1x = 50k events: a few minutes on 2 cores
    .venv/bin/python bench/graph_scaling.py --base-events 200000     # 1x = 200k events (16x = 3.2M)
    HIR_SPARK_MASTER=local[2] .venv/bin/python bench/graph_scaling.py --factors 1,4,16 --max-ratio 20

Each size is a synthetic dataset (jobs.sources.synthetic) whose users, items and events all scale with the factor,
ingested into its own warehouse (not timed), then both jobs run for the last simulated day with their default
flags. The figures are wall seconds per job and seconds per million events, measured in one Spark session, and
for each job the ratio of its time at the largest factor to its time at the smallest one: linear cost gives a ratio
equal to the factor ratio (16), fixed per-job overheads (Delta commits, task start-up) make it smaller. The bench
fails (exit 1) when a ratio exceeds --max-ratio.

Beside wall time the bench reports the executor CPU seconds of each job's stages (Spark's status API): on a shared
machine wall time also counts the wait for a core, CPU time only the job's own work.

Before the timed runs a warm-up runs both jobs once at the smallest size, so JVM start-up and code generation do
not inflate the smallest size's time (which would flatter the ratio).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

EVENTS_PER_USER = 100  # the demo's synthetic shape: 2k users, 5k items, 200k events
EVENTS_PER_ITEM = 40


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--base-events",
        type=int,
        default=50_000,
        help="Events at factor 1. 50k keeps the whole bench (16x = 800k events) to minutes on 2 cores.",
    )
    p.add_argument(
        "--factors", default="1,4,16", help="Comma-separated size factors; the ratio is last / first."
    )
    p.add_argument("--days", type=int, default=7, help="Simulated days (the graph's window covers them all).")
    p.add_argument("--seed", type=int, default=7, help="Generator seed.")
    p.add_argument(
        "--max-ratio",
        type=float,
        default=20.0,
        help="Largest acceptable time ratio (largest / smallest factor) per job: 20 for 16x is linear plus 25%% "
        "measurement noise on a shared 2-core machine.",
    )
    p.add_argument(
        "--warehouse", help="Root folder for the per-size warehouses (default: a temporary folder)."
    )
    p.add_argument("--no-warmup", action="store_true", help="Skip the untimed warm-up run.")
    return p.parse_args(argv)


class TaskClock:
    """Executor CPU seconds of the stages a block of work ran, from Spark's status REST API.

    Wall time on a shared machine includes waiting for a core; task CPU time does not, so its ratio shows the
    work's own growth. None when the Spark UI (which serves the API) is off.
    """

    def __init__(self, spark) -> None:
        sc = spark.sparkContext
        self.base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}" if sc.uiWebUrl else None

    def _cpu_by_stage(self) -> dict[tuple[int, int], float]:
        with urllib.request.urlopen(f"{self.base}/stages?status=complete", timeout=30) as answer:
            stages = json.load(answer)
        return {(s["stageId"], s["attemptId"]): s.get("executorCpuTime", 0) / 1e9 for s in stages}

    def measure(self, work):
        """(result of work(), wall seconds, task CPU seconds or None)."""
        before = self._cpu_by_stage() if self.base else {}
        started = time.perf_counter()
        result = work()
        wall = time.perf_counter() - started
        if not self.base:
            return result, wall, None
        time.sleep(1)  # the listener behind the API records the last stage asynchronously
        return result, wall, sum(cpu for stage, cpu in self._cpu_by_stage().items() if stage not in before)


def run_size(spark, clock: TaskClock, root: Path, factor: int, args: argparse.Namespace) -> dict[str, float]:
    """Ingest one size, then time both jobs on its last day."""
    from jobs.build_graph import GraphConfig, build_graph
    from jobs.ingest_events import IngestConfig, ingest
    from jobs.sample_neighbourhoods import SampleConfig, sample_day
    from jobs.sources.synthetic import SyntheticSpec

    events = args.base_events * factor
    spec = SyntheticSpec(
        users=max(1, events // EVENTS_PER_USER),
        items=max(1, events // EVENTS_PER_ITEM),
        events=events,
        seed=args.seed,
        days=args.days,
    )
    warehouse = str(root / f"x{factor}")
    started = time.perf_counter()
    report = ingest(spark, IngestConfig(source="synthetic", synthetic=spec, warehouse=warehouse))
    ingest_s = time.perf_counter() - started
    ds = dt.date.fromisoformat(report.days[-1])

    graph, build_s, build_cpu = clock.measure(
        lambda: build_graph(spark, GraphConfig(ds=ds, warehouse=warehouse))
    )
    if not graph.reconciles:
        raise SystemExit(f"x{factor}: the graph does not reconcile with events: {graph.line()}")
    samples, sample_s, sample_cpu = clock.measure(
        lambda: sample_day(spark, SampleConfig(ds=ds, warehouse=warehouse))
    )
    return {
        "events": report.events,
        "ingest_s": ingest_s,
        "build_s": build_s,
        "build_cpu": build_cpu,
        "sample_s": sample_s,
        "sample_cpu": sample_cpu,
        "edges": sum(graph.edges.values()),
        "rows": sum(s["rows"] for s in samples.values()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    factors = sorted(int(f) for f in args.factors.split(","))
    from jobs.common.spark import get_spark

    spark = get_spark("hir-bench-graph")
    clock = TaskClock(spark)
    with tempfile.TemporaryDirectory(prefix="hir-graph-bench-") as tmp:
        root = Path(args.warehouse or tmp)
        if not args.no_warmup:
            run_size(spark, clock, root / "warmup", factors[0], args)
        results = {f: run_size(spark, clock, root, f, args) for f in factors}

    print(f"graph scaling: Spark {spark.version}, {spark.sparkContext.master}, {os.cpu_count()} cores")
    print(
        f"{'factor':>6} {'events':>9} {'edges':>9} {'samples':>8} {'ingest s':>9} | {'build s':>8} "
        f"{'s/M ev':>7} {'cpu s':>7} | {'sample s':>8} {'s/M ev':>7} {'cpu s':>7}"
    )

    def cpu(value: float | None) -> str:
        return f"{value:>7.1f}" if value is not None else f"{'-':>7}"

    for f, r in results.items():
        million = r["events"] / 1e6
        print(
            f"{f:>5}x {r['events']:>9} {r['edges']:>9} {r['rows']:>8} {r['ingest_s']:>9.1f} | "
            f"{r['build_s']:>8.1f} {r['build_s'] / million:>7.1f} {cpu(r['build_cpu'])} | "
            f"{r['sample_s']:>8.1f} {r['sample_s'] / million:>7.1f} {cpu(r['sample_cpu'])}"
        )
    small, large = results[factors[0]], results[factors[-1]]
    ok = True
    for job, key in (("build-graph", "build"), ("sample-neighbourhoods", "sample")):
        ratio = large[f"{key}_s"] / small[f"{key}_s"]
        verdict = "ok" if ratio <= args.max_ratio else f"FAIL (> {args.max_ratio:g})"
        cpu_ratio = (
            f"; task CPU ratio {large[f'{key}_cpu'] / small[f'{key}_cpu']:.2f}"
            if small[f"{key}_cpu"] and large[f"{key}_cpu"] is not None
            else ""
        )
        print(
            f"{job}: time x{factors[-1]} / time x{factors[0]} = {ratio:.2f} for "
            f"{large['events'] / small['events']:.1f}x the events{cpu_ratio}: {verdict}"
        )
        ok = ok and ratio <= args.max_ratio
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
