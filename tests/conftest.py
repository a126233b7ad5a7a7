"""Shared fixtures: one local SparkSession for the whole test run, temporary warehouses, the real data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """`../shared/data` beside the checkout (override with HIR_SHARED_DATA)."""
    return Path(os.environ.get("HIR_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items) -> None:
    """Test files with slow (end-to-end) tests first, each file's tests in their own order. `make test` runs two
    pytest-xdist workers that take whole files in this order (`--dist loadfile --no-loadscope-reorder`): the long
    files start at once and the short ones fill in around them, so both workers finish together instead of one
    running a cluster test alone at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: keeps the order within each group


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
