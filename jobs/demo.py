"""The `make demo` driver: every stage that exists, on the synthetic source and on the real datasets.

    python -m jobs.demo            # WAREHOUSE (default ./warehouse) and HIR_SHARED_DATA (../shared/data)

Each dataset gets its own warehouse under ./warehouse/<dataset>/. Real datasets are skipped with a note when
their folder is absent.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from jobs.common.args import run_job
from jobs.common.spark import get_spark
from jobs.ingest_events import IngestConfig, ingest
from jobs.sources.synthetic import SyntheticSpec


def datasets(shared: Path) -> list[tuple[str, IngestConfig | None, str]]:
    """(name, ingest config or None when absent, note)."""
    taobao = shared / "taobao_userbehavior" / "UserBehavior_user_complete.csv"
    rees46 = shared / "rees46_oct2019" / "2019-Oct_head.csv"
    return [
        (
            "synthetic",
            IngestConfig(source="synthetic", synthetic=SyntheticSpec(users=2000, items=5000, events=200_000)),
            "2k users, 5k items, ~200k events with planted interests",
        ),
        (
            "taobao",
            IngestConfig(source="taobao", inputs=(str(taobao),)) if taobao.exists() else None,
            str(taobao),
        ),
        (
            "rees46",
            IngestConfig(source="rees46", inputs=(str(rees46),)) if rees46.exists() else None,
            str(rees46),
        ),
    ]


def main(argv=None) -> int:
    root = Path(os.environ.get("WAREHOUSE", "warehouse"))
    shared = Path(os.environ.get("HIR_SHARED_DATA", "../shared/data"))
    spark = get_spark("hir-demo")
    summary = []
    for name, cfg, note in datasets(shared):
        if cfg is None:
            print(f"[{name}] skipped: {note} not found")
            continue
        started = time.perf_counter()
        cfg = IngestConfig(**{**cfg.__dict__, "warehouse": str(root / name)})
        report = ingest(spark, cfg)
        print(f"[{name}] ingest  {report.line()}  ({time.perf_counter() - started:.1f}s)")
        summary.append((name, report))
    print("\nsummary")
    for name, report in summary:
        print(
            f"  {name:<10} events {report.events:>8}  rejects {report.rejects:>4}  duplicates {report.duplicates:>5}"
            f"  days {len(report.days):>3}  -> {root / name}"
        )
    return 0 if all(r.reconciles for _, r in summary) else 1


if __name__ == "__main__":
    sys.exit(run_job(main))
