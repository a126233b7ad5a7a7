"""The code version of a stage: the hash of the source it imports, at any depth, and of nothing else."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from jobs.common import code


def edited(monkeypatch, module: str) -> None:
    """Pretend `module`'s source file gained a comment line (read through the same hook the hash reads)."""
    real = code._source

    def source(name: str) -> str | None:
        text = real(name)
        return text + "\n# an edit\n" if name == module and text is not None else text

    monkeypatch.setattr(code, "_source", source)


def test_closure_follows_imports_at_any_depth_and_inside_functions() -> None:
    train = code.closure(["jobs.train_encoder"])
    # train_encoder -> hir_model.trainer -> hir_model.encoder -> hir_model.attention: three levels down.
    assert {"jobs.train_encoder", "hir_model.trainer", "hir_model.encoder", "hir_model.attention"} <= set(
        train
    )
    assert {"jobs", "hir_model", "schemas.tables"} <= set(train)  # packages' __init__ and shared schemas
    # evaluate imports the stage jobs inside its functions only.
    assert {"jobs.train_encoder", "jobs.embed_entities"} <= set(code.closure(["jobs.evaluate"]))
    # Nothing outside the project (torch, pyspark) and nothing the job does not import.
    assert all(m.split(".")[0] in code.PROJECT_PACKAGES for m in train)
    assert "jobs.build_index" not in train and "jobs.embed_entities" not in train
    # The next-period input rows are built by the graph and sampler code: a sampler edit retrains.
    assert {"jobs.train.next_period", "jobs.build_graph", "jobs.sample_neighbourhoods"} <= set(train)


def test_a_model_code_change_changes_train_and_embed_but_not_the_graph_stages(monkeypatch) -> None:
    before = {
        m: code.code_version(m) for m in ("jobs.train_encoder", "jobs.embed_entities", "jobs.build_graph")
    }
    assert all(v.startswith("src:") for v in before.values())
    assert code.code_version("jobs.train_encoder") == before["jobs.train_encoder"]  # stable
    edited(monkeypatch, "hir_model.encoder")
    after = {m: code.code_version(m) for m in before}
    assert after["jobs.train_encoder"] != before["jobs.train_encoder"]
    assert after["jobs.embed_entities"] != before["jobs.embed_entities"]
    assert after["jobs.build_graph"] == before["jobs.build_graph"]


def test_a_change_to_another_job_leaves_train_alone(monkeypatch) -> None:
    before = code.code_version("jobs.train_encoder")
    edited(monkeypatch, "jobs.build_index")
    assert code.code_version("jobs.train_encoder") == before
    assert code.code_version("jobs.train_encoder", "jobs.build_index") != code.code_version(
        "jobs.train_encoder"
    )


def test_the_dist_zip_gives_the_same_version_as_the_checkout(tmp_path) -> None:
    """spark-submit runs the jobs from `make dist`'s zip: the hash reads sources through the import system."""
    from tests.conftest import REPO_ROOT

    archive = tmp_path / "hir.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for package in code.PROJECT_PACKAGES:
            for path in sorted((REPO_ROOT / package).rglob("*.py")):
                z.write(path, str(path.relative_to(REPO_ROOT)))
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from jobs.common import code; "
        "assert code.__file__.startswith(sys.argv[1]), code.__file__; print(code.code_version('jobs.train_encoder'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(archive)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == code.code_version("jobs.train_encoder")


def test_a_module_without_source_is_an_error() -> None:
    with pytest.raises(ValueError, match="no source for module jobs.nope"):
        code.closure(["jobs.nope"])
