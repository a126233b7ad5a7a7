"""The one reader and writer of the pipeline's Delta tables.

`write_table` refuses a DataFrame whose columns do not match the table's declared schema (naming the column), and
replaces exactly the slice it is told to (`replaceWhere`), so a rerun of the same day replaces and never appends.
A Delta commit is atomic: a job killed mid-write leaves the previous version in place.
Two jobs writing the same slice at once: Delta lets one commit, the other stops with one line (rerun it).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from hir_model import storage
from jobs.common.errors import HirError
from schemas.tables import TableSpec


def table_path(warehouse: str | Path, spec: TableSpec) -> str:
    """`<warehouse>/<table>`: an absolute local path, or the URI (s3a://, hdfs://) Hadoop's FileSystem opens."""
    return storage.join(warehouse, spec.name)


def _plain(dtype: DataType) -> DataType:
    """The type with nullability and metadata removed, for comparison."""
    if isinstance(dtype, ArrayType):
        return ArrayType(_plain(dtype.elementType), True)
    if isinstance(dtype, MapType):
        return MapType(_plain(dtype.keyType), _plain(dtype.valueType), True)
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, _plain(f.dataType), True) for f in dtype.fields])
    return dtype


def check_schema(df: DataFrame, spec: TableSpec) -> None:
    """Raise HirError naming the first missing, mistyped or undeclared column."""
    have = {f.name: f.dataType for f in df.schema.fields}
    for field in spec.schema.fields:
        if field.name not in have:
            raise HirError(f"table {spec.name}: column '{field.name}' is missing")
        if _plain(have[field.name]) != _plain(field.dataType):
            raise HirError(
                f"table {spec.name}: column '{field.name}' has type {have[field.name].simpleString()}, "
                f"declared {field.dataType.simpleString()}"
            )
    extra = [name for name in have if name not in spec.columns]
    if extra:
        raise HirError(f"table {spec.name}: column '{extra[0]}' is not declared in schemas/tables.py")


def conform(df: DataFrame, spec: TableSpec) -> DataFrame:
    """Declared column order, with the column docs attached as metadata."""
    check_schema(df, spec)
    return df.select([F.col(f.name).alias(f.name, metadata=f.metadata) for f in spec.schema.fields])


def ensure_table(spark: SparkSession, spec: TableSpec, warehouse: str | Path) -> str:
    """Create the table (schema, partitioning, properties, docs) if it does not exist; return its path.

    A table written before a nullable column was declared gets it added (old rows read NULL there): the one schema
    change the project makes without a migration step. Anything else that differs is an error at write time."""
    from delta.tables import DeltaTable

    path = table_path(warehouse, spec)
    if DeltaTable.isDeltaTable(spark, path):
        add_declared_columns(spark, spec, path)
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(spec.schema).comment(spec.doc)
    if spec.partition_by:
        builder = builder.partitionedBy(*spec.partition_by)
    for key, value in spec.properties.items():
        builder = builder.property(key, value)
    builder.execute()
    return path


def _sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def add_declared_columns(spark: SparkSession, spec: TableSpec, path: str) -> None:
    """ALTER TABLE ADD COLUMNS for the declared nullable columns the table at `path` lacks."""
    have = {f.name for f in spark.read.format("delta").load(path).schema.fields}
    missing = [f for f in spec.schema.fields if f.name not in have]
    required = [f.name for f in missing if not f.nullable]
    if required:
        raise HirError(
            f"table {spec.name} at {path} lacks the non-null column(s) {', '.join(required)}: rebuild it, "
            "old rows cannot be given a value"
        )
    if missing:
        columns = ", ".join(
            f"`{f.name}` {f.dataType.simpleString()} COMMENT '{_sql_string(f.metadata.get('comment', ''))}'"
            for f in missing
        )
        location = path.replace("`", "``")
        spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({columns})")


def write_table(
    df: DataFrame,
    spec: TableSpec,
    warehouse: str | Path,
    replace_where: str | None,
    *,
    user_metadata: str | None = None,
) -> int:
    """Replace the rows matching `replace_where` (None: the whole table) with `df`; return the new version.

    Delta checks that every written row matches `replace_where`, so a job cannot write outside its slice.
    """
    spark = df.sparkSession
    with concurrent_write_is_an_error(spec, warehouse):
        path = ensure_table(spark, spec, warehouse)
        writer = conform(df, spec).write.format("delta").mode("overwrite")
        if replace_where is not None:
            writer = writer.option("replaceWhere", replace_where)
        if user_metadata:
            writer = writer.option("userMetadata", user_metadata)
        writer.save(path)
    return table_version(spark, spec, warehouse)


# Delta's commit conflicts (io.delta.exceptions.*): another writer committed to the slice this one read.
_CONFLICT = re.compile(
    r"io\.delta\.exceptions\.((?:Concurrent\w*|MetadataChanged|ProtocolChanged|DeltaConcurrentModification)"
    r"Exception)"
)


@contextmanager
def concurrent_write_is_an_error(spec: TableSpec, warehouse: str | Path) -> Iterator[None]:
    """Turn a Delta commit conflict into a one-line HirError: nothing of the losing write was committed, so
    rerunning it is safe (it replaces the same slice)."""
    from delta import exceptions as conflicts

    try:
        yield
    except Exception as exc:
        kinds = tuple(getattr(conflicts, name) for name in conflicts.__all__)
        found = _CONFLICT.search(str(exc))
        if not isinstance(exc, kinds) and found is None:
            raise
        text = str(exc)
        if isinstance(exc, kinds):
            kind, detail = type(exc).__name__, text
        else:
            kind, detail = found.group(1), text[found.end() :]
        # First line of Delta's message, without its error class and repeated exception name.
        detail = (detail.strip(" :\n").splitlines() or [""])[0]
        detail = re.sub(rf"^(\[[A-Z_.]+\]\s*)?({kind}:\s*)?", "", detail)
        detail = re.sub(r"\s*Refer to https?://\S+ for more information\.?$", "", detail).strip()
        raise HirError(
            f"table {spec.name} at {table_path(warehouse, spec)}: concurrent write, rerun the job "
            f"({kind}: {detail})"
        ) from None


def merge_table(df: DataFrame, spec: TableSpec, warehouse: str | Path, keys: tuple[str, ...]) -> int:
    """Upsert `df` into the table on `keys` (update matched rows, insert the rest); return the new version."""
    from delta.tables import DeltaTable

    spark = df.sparkSession
    condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    with concurrent_write_is_an_error(spec, warehouse):
        path = ensure_table(spark, spec, warehouse)
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(conform(df, spec).alias("s"), condition)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
    return table_version(spark, spec, warehouse)


def table_exists(spark: SparkSession, spec: TableSpec, warehouse: str | Path) -> bool:
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, table_path(warehouse, spec))


def table_not_found(spec: TableSpec, warehouse: str | Path) -> HirError:
    return HirError(
        f"table {spec.name} not found at {table_path(warehouse, spec)}: run the stage that writes it"
    )


def read_table(
    spark: SparkSession, spec: TableSpec, warehouse: str | Path, version: int | None = None
) -> DataFrame:
    """Read a table (optionally at a Delta version); a missing table is a one-line error."""
    if not table_exists(spark, spec, warehouse):
        raise table_not_found(spec, warehouse)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(table_path(warehouse, spec))


# A Delta commit file: the version, zero-padded to 20 digits (temporary and checkpoint files never match).
_COMMIT_FILE = re.compile(r"(\d{20})\.json")


def table_version(spark: SparkSession, spec: TableSpec, warehouse: str | Path) -> int:
    """The table's latest version: its newest commit file in `_delta_log`, listed through Hadoop's FileSystem of
    the path's scheme. Delta publishes a commit by creating that file atomically, so the listing is what
    `DESCRIBE HISTORY ... LIMIT 1` reads, without its Spark job (the pipeline asks for every table's version
    before and after each stage)."""
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.hadoop.fs.Path(f"{table_path(warehouse, spec)}/_delta_log")
    filesystem = log.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    names = [
        status.getPath().getName()
        for status in filesystem.globStatus(jvm.org.apache.hadoop.fs.Path(log, "*.json")) or []
    ]
    versions = [int(found.group(1)) for found in map(_COMMIT_FILE.fullmatch, names) if found]
    if not versions:
        raise table_not_found(spec, warehouse)
    return max(versions)


def sql_in(column: str, values: list) -> str:
    """`column IN (...)` with values quoted for a replaceWhere predicate; an empty list matches nothing."""
    if not values:
        return "false"
    quoted = ", ".join("'" + str(v).replace("'", "''") + "'" for v in sorted(values))
    return f"{column} IN ({quoted})"


# -- snapshots: a table at one version as its exact Parquet files (what training and embedding read) ----------


@dataclass(frozen=True)
class TableSnapshot:
    """One Delta table at one version (and day): the exact Parquet files that hold its rows."""

    table: str
    path: str
    version: int
    ds: str | None
    files: tuple[str, ...]
    rows: int

    def lineage(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "path": self.path,
            "version": self.version,
            "ds": self.ds,
            "rows": self.rows,
            "files": list(self.files),
        }


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def table_snapshot(spark, spec, warehouse: str, version: int | None, ds: dt.date | None) -> TableSnapshot:
    """Resolve a table (at `version`, default latest; the `ds` partition) to its files; refuse deletion vectors."""
    from pyspark.errors import AnalysisException

    from hir_model.data import file_url

    path = table_path(warehouse, spec)
    frame = read_table(spark, spec, warehouse)  # one-line HirError when the table does not exist
    latest = table_version(spark, spec, warehouse)
    version = latest if version is None else version
    if version > latest:
        raise HirError(f"table {spec.name} has no version {version} (latest is {latest})")
    try:
        frame = read_table(spark, spec, warehouse, version)
        if ds is not None:
            frame = frame.where(F.col("ds") == F.lit(ds))
        files = tuple(sorted(file_url(unquote(f)) for f in frame.inputFiles()))
        kept = {
            file_url(unquote(r[0])): int(r[1])
            for r in frame.groupBy(F.col("_metadata.file_path")).count().collect()
        }
    except AnalysisException as err:
        raise HirError(f"table {spec.name} version {version}: {first_line(err)}") from None
    check_no_deletion_vectors(spark, spec.name, path, version, files, kept)
    return TableSnapshot(spec.name, path, version, str(ds) if ds else None, files, sum(kept.values()))


def check_no_deletion_vectors(
    spark, name: str, path: str, version: int, files: Sequence[str], kept: dict[str, int]
) -> None:
    """Raw Parquet reads see rows a deletion vector removed: refuse a table that enables them, and any file whose
    Parquet row count differs from the rows the Delta snapshot keeps of it."""
    from hir_model.data import parquet_row_counts

    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    if (detail["properties"] or {}).get("delta.enableDeletionVectors", "false").lower() == "true":
        raise HirError(
            f"table {name} enables deletion vectors (delta.enableDeletionVectors): training and embedding read "
            f"its Parquet files directly and would bring deleted rows back; disable them and run REORG TABLE ... APPLY (PURGE)"
        )
    for file, rows in zip(files, parquet_row_counts(files), strict=True):
        if kept.get(file, 0) != rows:
            raise HirError(
                f"table {name} version {version}: {file} holds {rows} rows but the snapshot keeps "
                f"{kept.get(file, 0)} (deletion vectors); run REORG TABLE ... APPLY (PURGE) first"
            )
