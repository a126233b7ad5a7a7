"""A Delta table's latest version: `jobs.common.delta.table_version` (the newest commit file in `_delta_log`,
listed through Hadoop's FileSystem) against `DeltaTable.history(1)` (what it used before), side by side on the
same table in the same session.

    .venv/bin/python bench/table_version.py                  # a table of 20 commits, 50 calls each
    .venv/bin/python bench/table_version.py --commits 200 --calls 100

The pipeline asks for the version of every table a stage reads and writes, before and after it runs (49 times on
a tiny synthetic day), so this is a fixed cost of every stage, fresh or not. Both ways must agree: the bench checks
it on every call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--commits", type=int, default=20, help="commits in the table (a month of daily writes)"
    )
    parser.add_argument("--calls", type=int, default=50, help="calls timed per method")
    args = parser.parse_args(argv)

    from delta.tables import DeltaTable

    from jobs.common.delta import table_path, table_version
    from jobs.common.spark import get_spark
    from schemas.tables import EVAL_METRICS

    spark = get_spark("bench-table-version", shuffle_partitions=2, ui=False)
    with tempfile.TemporaryDirectory() as folder:
        path = table_path(folder, EVAL_METRICS)  # any table name: only its log is read
        for day in range(args.commits + 1):  # versions 0 .. commits
            spark.range(day, day + 1).write.format("delta").mode("append").save(path)

        def by_history() -> int:
            return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])

        def by_listing() -> int:
            return table_version(spark, EVAL_METRICS, folder)

        timings: dict[str, list[float]] = {"history(1)": [], "listing": []}
        for _ in range(args.calls):  # interleaved, so both see the same JVM state
            for name, method in (("history(1)", by_history), ("listing", by_listing)):
                started = time.perf_counter()
                version = method()
                timings[name].append(time.perf_counter() - started)
                assert version == args.commits, (name, version)
    spark.stop()

    base = statistics.median(timings["history(1)"])
    print(f"table of {args.commits} commits, {args.calls} calls each, median ms per call")
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"  {name:12s} {median * 1000:8.2f} ms   ratio to history(1) {median / base:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
