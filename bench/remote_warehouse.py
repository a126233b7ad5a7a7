"""The same synthetic day through `hir pipeline` on a local warehouse and on an `s3a://` warehouse of a real S3
server (s3proxy on a local folder), in one Spark session, side by side: wall time per stage and the ratio.

    .venv/bin/python bench/remote_warehouse.py                 # every day stage, tiny sizes
    .venv/bin/python bench/remote_warehouse.py --evaluate      # the evaluation too (several times longer)

The S3 server runs on this machine, so the ratio is the cost of the S3A connector, the storage layer and the
object store's semantics (no rename: Delta writes and S3A's commit paths), not of a network. The tables of the
two runs are compared as well (the same rows apart from paths), so a fast but wrong run does not pass unnoticed.
A discarded local day runs first, so neither timed run pays for the JVM's warm-up.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

# The synthetic week's last day held out; the history's model trained with the day's own [train] flags.
EVALUATE = """
[evaluate]
args = {args}
methods = "hir,popularity,co_visitation"
bootstrap = 50
"""


def run_day(spark, warehouse: str, config: Path, evaluate: bool):
    from jobs.pipeline import config_from_args, run_pipeline
    from tests.jobs.test_pipeline import DS

    argv = ["--ds", DS, "--warehouse", warehouse, "--source", "synthetic", "--config", str(config)]
    started = time.perf_counter()
    report = run_pipeline(
        spark, config_from_args(argv + (["--evaluate"] if evaluate else [])), out=io.StringIO()
    )
    return time.perf_counter() - started, report


def table_rows(spark, spec, warehouse: str) -> list[str]:
    """The table's rows, sorted, without the columns that name where or by which run they were made."""
    from jobs.common.delta import read_table

    drop = [
        c for c in ("input_file", "run_id", "model_version", "previous_model_version") if c in spec.columns
    ]
    return sorted(repr(tuple(r)) for r in read_table(spark, spec, warehouse).drop(*drop).collect())


def same_tables(spark, local: str, remote: str) -> list[str]:
    """Names of the day's tables whose rows differ between the two warehouses."""
    from jobs.common.delta import table_exists
    from jobs.pipeline import STAGES

    specs = sorted({s.name: s for stage in STAGES for s in stage.writes}.values(), key=lambda s: s.name)
    return [
        spec.name
        for spec in specs
        if table_exists(spark, spec, local)
        and table_rows(spark, spec, local) != table_rows(spark, spec, remote)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evaluate", action="store_true", help="also run the evaluation stage")
    args = parser.parse_args()

    from hir_model import storage
    from jobs.common.spark import get_spark
    from jobs.pipeline import config_args
    from tests.jobs.test_pipeline import CONFIG  # the tiny day of the pipeline tests
    from tests.servers import start_s3proxy

    with tempfile.TemporaryDirectory(prefix="hir-bench-s3-") as tmp:
        folder = Path(tmp)
        server = start_s3proxy(folder / "s3")
        try:
            conf = {f"spark.hadoop.{k}": v for k, v in server.hadoop_conf().items()}
            spark = get_spark("hir-bench-remote", shuffle_partitions=2, ui=False, extra_conf=conf)
            storage.configure(storage.S3Settings.from_hadoop(server.hadoop_conf()))
            config = folder / "pipeline.toml"
            config.write_text(CONFIG)
            if args.evaluate:
                train = shlex.join(config_args(str(config)).get("train", ()))
                protocol = ["--protocol", "temporal", "--cutoff", "2026-01-07T00:00:00+00:00"]
                evaluate = EVALUATE.format(args=json.dumps([*protocol, "--stage-args", f"train={train}"]))
                config.write_text(CONFIG + evaluate)
            local, remote = str(folder / "warehouse"), server.new_bucket("bench") + "/warehouse"
            # A discarded day first: the JVM's warm-up (class loading, JIT) would otherwise fall on whichever
            # warehouse runs first and flatter the second.
            run_day(spark, str(folder / "warm-up"), config, evaluate=False)
            local_s, local_report = run_day(spark, local, config, args.evaluate)
            remote_s, remote_report = run_day(spark, remote, config, args.evaluate)
            print(f"{'stage':24} {'local s':>9} {'s3a s':>9} {'ratio':>7}")
            for stage in local_report.stages:
                there = remote_report.result(stage.name)
                ratio = there.seconds / stage.seconds if stage.seconds else float("nan")
                print(f"{stage.name:24} {stage.seconds:9.1f} {there.seconds:9.1f} {ratio:7.2f}")
            print(f"{'whole day':24} {local_s:9.1f} {remote_s:9.1f} {remote_s / local_s:7.2f}")
            print(f"statuses: local {local_report.status()}, s3a {remote_report.status()}")
            differ = same_tables(spark, local, remote)
            print("tables: " + ("the same rows on both" if not differ else f"DIFFER: {', '.join(differ)}"))
            return 0 if not differ and local_report.ok and remote_report.ok else 1
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
