"""Reading raw delimited files line by line, so that every record, even a broken one, is kept verbatim."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.utils import AnalysisException

from hir_model import storage
from jobs.common.errors import HirError


def check_inputs(paths: list[str]) -> None:
    """Local inputs must exist. Remote ones (s3a://, hdfs://, and any other filesystem the cluster's Hadoop has,
    gs:// or abfss://) are opened by Spark, whose missing-path error `read_lines` turns into one line."""
    if not paths:
        raise HirError("--input is required for this source")
    for path in paths:
        if storage.on_this_machine(path) and not storage.local_path(path).exists():
            raise HirError(f"input not found: {path}")


def read_lines(spark: SparkSession, paths: list[str], header: str | None) -> DataFrame:
    """One row per line: `record` (line without its CR/LF) and `input_file`; lines equal to `header` dropped.

    Spark's text reader splits on \\n, \\r\\n and \\r alike, so CRLF files need no special care.
    """
    check_inputs(paths)
    try:
        lines = spark.read.text(paths).select(
            F.col("value").alias("record"), F.col("_metadata.file_path").alias("input_file")
        )
    except AnalysisException as exc:
        raise HirError(f"cannot read {', '.join(paths)}: {str(exc).splitlines()[0]}") from None
    if header is not None:
        lines = lines.where(F.col("record") != F.lit(header))
    return lines


def first_line(spark: SparkSession, path: str) -> str | None:
    """The first line of one file (a generic source's header)."""
    check_inputs([path])
    row = spark.read.text(path).limit(1).first()
    return None if row is None else row[0]
