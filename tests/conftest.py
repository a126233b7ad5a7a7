"""Shared fixtures: one local SparkSession for the whole test run, temporary warehouses, the real data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """`../shared/data` beside the checkout (override with HIR_SHARED_DATA)."""
    return Path(os.environ.get("HIR_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def spark():
    from jobs.common.spark import get_spark

    session = get_spark("hir-tests", shuffle_partitions=2, ui=False)
    yield session
    session.stop()


@pytest.fixture()
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    folder = shared_data_dir()
    if not folder.is_dir():
        pytest.fail(f"real datasets not found at {folder} (set HIR_SHARED_DATA)")
    return folder
