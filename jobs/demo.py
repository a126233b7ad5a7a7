"""The `make demo` driver: `hir pipeline` with the evaluation, on the synthetic source and on the real datasets.

    python -m jobs.demo            # WAREHOUSE (default ./warehouse) and HIR_SHARED_DATA (../shared/data)
    python -m jobs.demo synthetic  # only the named datasets

Each dataset gets its own warehouse under ./warehouse/<dataset>/ (tables, models, indexes, the evaluation's
history warehouse under eval/, the report under reports/). Model sizes come from conf/pipeline/demo.toml; the
evaluation trains its models with the same flags. Real datasets are skipped with a note when their folder is
absent. A rerun resumes: stages whose outputs are fresh are skipped (the pipeline's lineage).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from jobs.common.args import run_job
from jobs.common.spark import PROJECT_ROOT, get_spark
from jobs.eval.report import console_table
from jobs.pipeline import config_args, config_from_args, run_pipeline

DEMO_CONFIG = PROJECT_ROOT / "conf" / "pipeline" / "demo.toml"


@dataclass(frozen=True)
class Dataset:
    name: str
    ds: str  # the day the pipeline builds: the dataset's last day
    ingest: tuple[str, ...]  # --source and its flags
    evaluate: tuple[str, ...]  # protocol flags
    input_path: Path | None = None  # None: generated


def datasets(shared: Path) -> list[Dataset]:
    taobao = shared / "taobao_userbehavior" / "UserBehavior_user_complete.csv"
    rees46 = shared / "rees46_oct2019" / "2019-Oct_head.csv"
    return [
        Dataset(
            "synthetic",
            "2026-01-07",  # SyntheticSpec's default 7 days from 2026-01-01
            # Smaller than demo.toml's [ingest]: minutes on 2 cores with the evaluation's four trainings.
            ("--source", "synthetic", "--users", "1000", "--items", "2000", "--events", "60000"),
            ("--protocol", "temporal", "--cutoff", "2026-01-07T00:00:00+00:00"),
        ),
        Dataset(
            "taobao",
            "2017-12-03",
            ("--source", "taobao", "--input", str(taobao)),
            # SOURCE.md's deep-funnel split: history before 2017-12-02 00:00 China time.
            ("--protocol", "temporal", "--cutoff", "2017-12-02T00:00:00+08:00"),
            taobao,
        ),
        Dataset(
            "rees46",
            "2019-10-01",
            ("--source", "rees46", "--input", str(rees46)),
            # Three hours of data: too short for a global cut-off (SOURCE.md).
            ("--protocol", "leave_last_conversion_out"),
            rees46,
        ),
    ]


def pipeline_argv(dataset: Dataset, warehouse: Path) -> list[str]:
    train = shlex.join(config_args(str(DEMO_CONFIG)).get("train", ()))
    evaluate = shlex.join([*dataset.evaluate, "--stage-args", f"train={train}"])
    return [
        "--ds",
        dataset.ds,
        "--warehouse",
        str(warehouse),
        "--config",
        str(DEMO_CONFIG),
        "--evaluate",
        "--stage-args",
        f"evaluate={evaluate}",
        *dataset.ingest,
    ]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    root = Path(os.environ.get("WAREHOUSE", "warehouse"))
    shared = Path(os.environ.get("HIR_SHARED_DATA", "../shared/data"))
    chosen = [d for d in datasets(shared) if not argv or d.name in argv]
    spark = get_spark("hir-demo")
    outcomes = []
    for dataset in chosen:
        if dataset.input_path is not None and not dataset.input_path.exists():
            print(f"[{dataset.name}] skipped: {dataset.input_path} not found")
            continue
        print(f"\n=== {dataset.name} -> {root / dataset.name}")
        report = run_pipeline(spark, config_from_args(pipeline_argv(dataset, root / dataset.name)))
        outcomes.append((dataset.name, report))
    print("\nsummary")
    for name, report in outcomes:
        evaluation = report.result("evaluate")
        print(f"  {name:<10} {'ok' if report.ok else 'FAILED'} in {report.seconds:.0f}s -> {root / name}")
        print(f"    {evaluation.line}")
        if evaluation.report is not None:  # ran now (a fresh evaluation is skipped: its report is on disk)
            print(console_table(evaluation.report.rows, k=50))
    return 0 if outcomes and all(report.ok for _, report in outcomes) else 1


if __name__ == "__main__":
    sys.exit(run_job(main))
