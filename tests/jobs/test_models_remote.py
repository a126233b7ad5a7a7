"""Model versions on an object store: a writer killed halfway through uploading a version leaves the previous
version the live one, loadable, and the next write of that name replaces the leftovers (a real S3 server, a real
SIGKILL in a subprocess)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch

from hir_model import storage
from hir_model.checkpoint import CRASH_ENV, is_complete, list_versions, load_model, write_model_dir
from hir_model.config import ModelConfig, TrainConfig
from hir_model.trainer import Trainer
from jobs.embed_entities import resolve_model_dir
from tests.conftest import REPO_ROOT

TINY = ModelConfig(id_buckets=64, dim=8, heads=2, layers=1, max_tokens=4, num_prototypes=4)

WRITE_VERSION = """
import sys
from hir_model.config import ModelConfig, TrainConfig
from hir_model.trainer import Trainer
config = ModelConfig(id_buckets=64, dim=8, heads=2, layers=1, max_tokens=4, num_prototypes=4)
Trainer(config, TrainConfig(seed=2), device="cpu").save(sys.argv[1])
"""


def test_a_kill_during_a_model_upload_leaves_the_previous_version_live(
    s3_server, s3_settings, tmp_path, monkeypatch
):
    monkeypatch.setenv("HIR_CACHE_DIR", str(tmp_path / "cache"))
    warehouse = s3_server.new_bucket("models-killed") + "/warehouse"
    models = storage.join(warehouse, "models")
    first = Trainer(TINY, TrainConfig(seed=1), device="cpu")
    first.save(storage.join(models, "v1"))

    env = {
        **os.environ,
        CRASH_ENV: "mid_upload",
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_REGION": "us-east-1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    second = storage.join(models, "v2")
    killed = subprocess.run(
        [sys.executable, "-c", WRITE_VERSION, second], env=env, cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # The killed writer got its other files up, not weights.pt: no reader takes that for a version.
    assert "config.json" in storage.listdir(second) and not is_complete(second)
    assert list_versions(models) == [storage.join(models, "v1")]
    live = resolve_model_dir(warehouse, None)
    assert storage.name(live) == "v1"
    loaded = load_model(live)
    assert loaded.version == "v1"
    for name, tensor in first.student.state_dict().items():
        assert torch.equal(loaded.encoder.state_dict()[name], tensor), name

    # The next write of that name replaces the leftovers and becomes the live version.
    write_model_dir(second, {"student": Trainer(TINY, TrainConfig(seed=3)).student.state_dict()}, {})
    assert is_complete(second) and storage.name(resolve_model_dir(warehouse, None)) == "v2"
