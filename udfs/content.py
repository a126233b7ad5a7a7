"""pandas UDF that embeds entity texts with a content encoder loaded once per Python worker."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, FloatType

from hir_model.content import TextEncoder, load_encoder


@lru_cache(maxsize=2)
def cached_encoder(spec: str) -> TextEncoder:
    """One encoder per worker process and spec: Spark reuses Python workers across tasks."""
    return load_encoder(spec)


def embed_text(text: Column, encoder_spec: str) -> Column:
    """Column of L2-normalised content vectors for a column of texts."""

    @F.pandas_udf(ArrayType(FloatType(), False))
    def _embed(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        encoder = cached_encoder(encoder_spec)
        for texts in batches:
            vectors = encoder.encode(texts.fillna("").tolist())
            yield pd.Series(list(vectors))

    return _embed(text)
