"""The Spark <-> model bridge of the embed stage: a mapInPandas function that loads the model once per Python
worker and turns Arrow batches of neighbourhood rows into embeddings and Bag-of-Meaning codes.

Python workers are processes of their own, on any machine of the cluster: they read the model version (a path or
a remote URI, copied once per machine into storage's cache) and the content files with the storage settings the
driver had when it built the EmbedSpec, which travel in the spec."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd
from pyspark.sql.types import ArrayType, FloatType, IntegerType, LongType, StringType, StructField, StructType

from hir_model import storage
from hir_model.batch import TOKEN_COLUMNS as _TOKEN_ARRAYS

# The neighbourhood columns the model reads (hir_model.batch owns the list).
TOKEN_COLUMNS: tuple[str, ...] = ("num_tokens", *_TOKEN_ARRAYS)

OUTPUT_SCHEMA = StructType(
    [
        StructField("node_id", LongType(), False),
        StructField("node_type", StringType(), False),
        StructField("raw_id", StringType(), False),
        StructField("vector", ArrayType(FloatType(), False), False),
        # Flattened (levels x top_n), strongest first within a level: Arrow cannot carry 2-D numpy cells.
        StructField("bom_codes", ArrayType(IntegerType(), False), False),
        StructField("bom_weights", ArrayType(FloatType(), False), False),
    ]
)


@dataclass(frozen=True)
class EmbedSpec:
    model_dir: str
    content_files: tuple[str, ...] = ()  # parquet files of the entity_content snapshot; () = no content
    batch_size: int = 256
    device: str = "auto"  # auto: the task's GPU, else any CUDA device, else CPU
    precision: str = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    top_n: int = 3
    temperature: float | None = None  # None: the quantiser's calibrated per-level temperatures
    # Hysteresis of the hard codes, in temperatures (ResidualQuantiser.bag); used where rows carry the column
    # PREVIOUS_CODES (yesterday's path, null for an entity without one).
    stickiness: float = 0.0
    # How the workers reach a remote store: the driver's settings when the spec is built (picklable, frozen).
    storage_settings: storage.S3Settings = field(default_factory=storage.s3_settings)


PREVIOUS_CODES = "previous_codes"


def previous_code_matrix(cells: np.ndarray, levels: int) -> np.ndarray:
    """(N, levels) int64 of yesterday's codes from an object column of int arrays (None: no path; -1 fills)."""
    out = np.full((len(cells), levels), -1, dtype=np.int64)
    for row, cell in enumerate(cells):
        if cell is not None:
            codes = np.asarray(cell, dtype=np.int64)[:levels]
            out[row, : len(codes)] = codes
    return out


def choose_device(requested: str):
    """The task's assigned GPU when Spark scheduled one, else CUDA if present, else CPU."""
    import torch

    if requested != "auto":
        return torch.device(requested)
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        gpus = context.resources().get("gpu") if context is not None else None
        if gpus is not None and gpus.addresses and torch.cuda.is_available():
            return torch.device(f"cuda:{gpus.addresses[0]}")
    except Exception:  # noqa: BLE001 - no task context outside Spark: fall through
        pass
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@lru_cache(maxsize=2)
def load_for_worker(
    model_dir: str,
    content_files: tuple[str, ...],
    device: str,
    settings: storage.S3Settings | None = None,
):
    """(model, content table or None), loaded once per worker process and reused by every task it runs.
    `settings`: the driver's storage settings, which this process takes on before it reads anything."""
    import pyarrow.parquet as pq
    import torch

    from hir_model.batch import ContentTable
    from hir_model.checkpoint import load_model

    if settings is not None:
        storage.configure(settings)
    model = load_model(model_dir, device=torch.device(device))
    model.encoder.eval()
    content = None
    if content_files and model.config.use_content and model.config.content_dim > 0:
        filesystem, _ = storage.filesystem(content_files[0])
        table = pq.ParquetDataset(
            [storage.filesystem(f)[1] for f in content_files], filesystem=filesystem
        ).read(columns=["node_id", "vector"])
        vectors = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
        content = ContentTable(table.column("node_id").to_numpy(), vectors)
    return model, content


def embed_frame(pdf: pd.DataFrame, model, content, device, spec: EmbedSpec) -> pd.DataFrame:
    """Embed one pandas batch of neighbourhood rows (the same code path the tests call directly)."""
    import torch

    from hir_model.batch import batch_from_columns

    batch = batch_from_columns({c: pdf[c].to_numpy() for c in TOKEN_COLUMNS})
    if content is not None:
        batch = content.attach(batch)
    use_bf16 = spec.precision == "bf16" or (spec.precision == "auto" and device.type == "cuda")
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
        embeddings = model.encoder(batch.to(device)).float()
    embeddings = torch.nn.functional.normalize(embeddings, dim=-1).cpu()  # (B, dim)
    if model.quantiser is not None:
        previous = None
        if spec.stickiness > 0 and PREVIOUS_CODES in pdf.columns:
            matrix = previous_code_matrix(pdf[PREVIOUS_CODES].to_numpy(), model.quantiser.levels)
            previous = torch.from_numpy(matrix)
        codes, weights = model.quantiser.bag(
            embeddings,
            top_n=spec.top_n,
            temperature=spec.temperature,
            previous=previous,
            stickiness=spec.stickiness,
        )
        codes = codes.reshape(len(pdf), -1).numpy().astype(np.int32)
        weights = weights.reshape(len(pdf), -1).numpy().astype(np.float32)
    else:
        codes = np.zeros((len(pdf), 0), np.int32)
        weights = np.zeros((len(pdf), 0), np.float32)
    return pd.DataFrame(
        {
            "node_id": pdf["node_id"].to_numpy(),
            "node_type": pdf["node_type"].to_numpy(),
            "raw_id": pdf["raw_id"].to_numpy(),
            "vector": list(embeddings.numpy().astype(np.float32)),
            "bom_codes": list(codes),
            "bom_weights": list(weights),
        }
    )


def embed_partitions(spec: EmbedSpec) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The function for `DataFrame.mapInPandas(..., OUTPUT_SCHEMA)`."""

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        device = choose_device(spec.device)
        model, content = load_for_worker(
            spec.model_dir, spec.content_files, str(device), spec.storage_settings
        )
        for pdf in batches:
            for start in range(0, len(pdf), spec.batch_size):
                yield embed_frame(pdf.iloc[start : start + spec.batch_size], model, content, device, spec)

    return run
