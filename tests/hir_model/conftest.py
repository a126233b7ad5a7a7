"""Shared fixtures of the model tests: one torch thread, and a tiny model config that trains in seconds on CPU."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from hir_model.config import ModelConfig


@pytest.fixture(autouse=True, scope="package")
def single_torch_thread() -> Iterator[None]:
    # The CI box has 2 cores shared with a Spark JVM: two intra-op threads then spin against each other and run
    # 5-20x slower than one. Restored after this package, so other suites keep their setting.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny_config() -> ModelConfig:
    """Small but complete: every feature on, sdpa backend (CPU training), 16-token trees."""
    return ModelConfig(
        id_buckets=1024,
        dim=32,
        heads=2,
        layers=2,
        ffn_mult=2,
        dropout=0.0,
        max_tokens=16,
        num_recency_buckets=16,
        content_dim=8,
        num_prototypes=16,
        head_hidden=32,
        head_bottleneck=16,
        teacher_temp_warmup_steps=2,
    )
