"""The local driver JVM's options: one synthetic `hir pipeline` day under JDK 17's default collector (G1) against
the throughput collector that local runs use (`jobs.common.spark.LOCAL_DRIVER_JAVA_OPTIONS`), side by side, or
under any other sets of JVM options (`--options`; the first set is the baseline of the ratios).

    .venv/bin/python bench/driver_gc.py                          # a small day (500 users), twice per collector
    .venv/bin/python bench/driver_gc.py --users 2000 --events 100000 --repeats 3
    # the tests' day size, the local default against C1-only compilation (tried for the tests and reverted: it
    # killed the JVM inside ALS's fit; docs/experiments.md, "Test suite time"):
    .venv/bin/python bench/driver_gc.py --users 60 --items 120 --events 3000 \
        --options "Parallel=default" --options "Parallel, C1 only=-XX:+UseParallelGC -XX:TieredStopAtLevel=1"

Each run is a fresh process (a JVM's collector and compilers are chosen at its start), on a fresh warehouse, with
the options set through HIR_DRIVER_JAVA_OPTIONS (`default`: unset, the local default); the runs alternate, so
every set sees the same machine. It reports the wall time and the CPU seconds of the whole process tree (the JVM
does most of a local day's work), median per set, and the ratio of each to the first set's. Every set must write
the same tables: the bench compares the day's embeddings row for row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

COLLECTORS = {"G1 (JVM default)": "-XX:+UseG1GC", "Parallel (local default)": None}  # the default --options
TICKS = os.sysconf("SC_CLK_TCK")


def _tree_cpu(root: int, seen: dict[int, float]) -> None:
    """Add the CPU seconds (user + system) of `root` and its descendants to `seen`, the highest reading per pid
    (a process's counters only grow, and an exited one is gone, so the last reading before it exits stands)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        seen[pid] = max(seen.get(pid, 0.0), (int(fields[11]) + int(fields[12])) / TICKS)


def run_day(java_options: str | None, warehouse: Path, conf: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one pipeline day in a fresh process."""
    env = dict(os.environ)
    env.pop("HIR_DRIVER_JAVA_OPTIONS", None)
    if java_options is not None:
        env["HIR_DRIVER_JAVA_OPTIONS"] = java_options
    command = [sys.executable, "-m", "jobs.pipeline", "--ds", "2026-01-07", "--warehouse", str(warehouse)]
    command += ["--source", "synthetic", "--config", str(conf)]
    started, seen = time.perf_counter(), {}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        _tree_cpu(proc.pid, seen)
        time.sleep(0.25)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"error: the pipeline day failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
    return wall, sum(seen.values())


def embeddings(warehouse: Path) -> list[tuple]:
    """The day's embeddings, read without Spark (as a ranking team would), sorted by entity."""
    from deltalake import DeltaTable

    from jobs.common.delta import table_path
    from schemas.tables import EMBEDDINGS

    frame = DeltaTable(table_path(str(warehouse), EMBEDDINGS)).to_pandas(
        columns=["entity_type", "node_id", "vector"]
    )
    return sorted((t, n, tuple(v)) for t, n, v in frame.itertuples(index=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=500, help="synthetic users of the day")
    parser.add_argument("--items", type=int, default=1000, help="synthetic items")
    parser.add_argument("--events", type=int, default=20_000, help="synthetic events")
    parser.add_argument("--repeats", type=int, default=2, help="runs per set of options, alternating")
    parser.add_argument(
        "--options",
        action="append",
        metavar="NAME=JAVA_OPTIONS",
        help="a set of driver JVM options to run (repeatable; `default` for the local default; the first is the "
        "baseline). Default: G1 against the local default",
    )
    args = parser.parse_args(argv)
    option_sets = COLLECTORS
    if args.options:
        if any("=" not in o for o in args.options):
            parser.error("--options takes NAME=JAVA_OPTIONS")
        pairs = [o.split("=", 1) for o in args.options]
        if len({n for n, _ in pairs}) < len(pairs):  # a dict would drop the earlier set silently
            parser.error("--options: each set needs its own NAME")
        option_sets = {n: None if v == "default" else v for n, v in pairs}
    baseline = next(iter(option_sets))
    from tests.jobs.test_pipeline import tiny_config  # the pipeline tests' tiny day, at the bench's size

    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in option_sets}
    tables: dict[str, list[tuple]] = {}
    with tempfile.TemporaryDirectory() as folder:
        conf = Path(folder) / "day.toml"
        conf.write_text(tiny_config(args.users, args.items, args.events))
        for repeat in range(args.repeats):
            for number, (name, options) in enumerate(option_sets.items()):
                warehouse = Path(folder) / f"warehouse-{repeat}-{number}"
                timings[name].append(run_day(options, warehouse, conf))
                tables.setdefault(name, embeddings(warehouse))
    first, *others = tables.values()
    if any(t != first for t in others):
        sys.exit("error: the option sets' days wrote different embeddings")

    base_wall, base_cpu = (statistics.median(t[i] for t in timings[baseline]) for i in (0, 1))
    print(
        f"one synthetic pipeline day ({args.users} users, {args.events} events), median of {args.repeats} runs"
    )
    for name, runs in timings.items():
        wall, cpu = (statistics.median(t[i] for t in runs) for i in (0, 1))
        print(
            f"  {name:28s} wall {wall:6.1f} s  cpu {cpu:6.1f} s   "
            f"ratio to {baseline}: wall {wall / base_wall:5.3f}  cpu {cpu / base_cpu:5.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
