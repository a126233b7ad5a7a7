"""Model directories: one immutable, atomically written folder per model version.

    <version>/weights.pt      plain state dicts only, loadable with torch.load(weights_only=True)
    <version>/config.json     {"model": ModelConfig, "train": TrainConfig}
    <version>/quantiser.pt    BoM codebooks (optional), weights-only too
    <version>/metrics.jsonl   one JSON object per training step
    <version>/lineage.json    what the model was built from (Delta table versions read, ...)

A version lives on a local path or a remote store's URI (s3a://, hdfs://, through hir_model.storage). It is written
so that a reader never sees half a model and an existing version is never overwritten:

  local   written into a temporary sibling folder and renamed into place, so a killed job leaves nothing under the
          version's name.
  remote  written into a local temporary folder, then uploaded with weights.pt last: weights.pt is the version's
          completion marker, so a killed upload leaves files that no reader takes for a version (the next write
          of that name replaces them), and the previous version stays the live one.

Readers take small JSON files straight from the store and the weights from a local copy (storage.local_copy, keyed
by the version's name and its weights.pt's size and time, so Spark workers download a version once per machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hir_model import storage
from hir_model.config import ModelConfig, TrainConfig
from hir_model.encoder import HIREncoder
from hir_model.quantiser import ResidualQuantiser

WEIGHTS_FILE = "weights.pt"  # written last: its presence marks a complete version
CONFIG_FILE = "config.json"
QUANTISER_FILE = "quantiser.pt"
METRICS_FILE = "metrics.jsonl"
LINEAGE_FILE = "lineage.json"

WEIGHTS_FORMAT = "hir-weights"  # marker inside weights.pt: tells our checkpoints from any other torch file
WEIGHTS_FORMAT_VERSION = 1

# Fault injection for the atomicity tests: the writer SIGKILLs itself at the named point (mid_upload: a remote
# version's other files are up, its weights.pt is not). Never set in production.
CRASH_ENV = "HIR_MODEL_CRASH_AT"

ModelPath = (
    Path | str
)  # a local folder as a Path, a remote one as its URI (pathlib would fold s3a:// to s3a:/)


def model_path(uri: str | Path) -> ModelPath:
    """A model folder as the code passes it around: an absolute Path when local, the URI when remote."""
    return storage.local_path(uri) if storage.is_local(uri) else storage.normalise(uri)


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _fill(folder: Path, weights, config, metrics, lineage, quantiser) -> None:
    """Write a version's files into an existing local folder."""
    torch.save(
        {**weights, "format": WEIGHTS_FORMAT, "format_version": WEIGHTS_FORMAT_VERSION},
        folder / WEIGHTS_FILE,
    )
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    with open(folder / METRICS_FILE, "w") as out:
        for row in metrics or []:
            out.write(json.dumps(row, sort_keys=True) + "\n")
    (folder / LINEAGE_FILE).write_text(
        json.dumps(lineage or {}, indent=2, sort_keys=True, default=str) + "\n"
    )
    if quantiser is not None:
        quantiser.save(folder / QUANTISER_FILE)


def write_model_dir(
    path: str | Path,
    weights: dict[str, Any],
    config: dict[str, Any],
    metrics: list[dict[str, Any]] | None = None,
    lineage: dict[str, Any] | None = None,
    quantiser: ResidualQuantiser | None = None,
) -> ModelPath:
    """Write a model version directory atomically (module doc); refuse if the version already exists."""
    if not storage.is_local(path):
        return _upload_model_dir(storage.normalise(path), weights, config, metrics, lineage, quantiser)
    path = storage.local_path(path)
    if path.exists():
        raise FileExistsError(
            f"model version {path} already exists; versions are immutable, write a new version"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        _fill(staging, weights, config, metrics, lineage, quantiser)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; readers (Spark executors) may run as another user
        try:
            os.rename(staging, path)
        except OSError as err:  # another writer got there first
            raise FileExistsError(f"model version {path} already exists; versions are immutable") from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _upload_model_dir(uri: str, weights, config, metrics, lineage, quantiser) -> str:
    """The remote write: the files into a local temporary folder, then up with weights.pt last. Two writers of one
    version at once are not told apart here (no conditional put); the pipeline's per-day lock serialises them."""
    if is_complete(uri):
        raise FileExistsError(
            f"model version {uri} already exists; versions are immutable, write a new version"
        )
    with tempfile.TemporaryDirectory(prefix="hir-model-") as staging:
        folder = Path(staging) / "version"
        folder.mkdir()
        _fill(folder, weights, config, metrics, lineage, quantiser)
        marker = (folder / WEIGHTS_FILE).read_bytes()
        (folder / WEIGHTS_FILE).unlink()
        storage.remove(uri)  # a killed upload's files (no weights.pt): never a version, replaced whole
        storage.upload_tree(folder, uri)
        _crash_point("mid_upload")
        storage.write_bytes(storage.join(uri, WEIGHTS_FILE), marker)  # one PUT: the version appears
    return uri


def is_complete(path: str | Path) -> bool:
    """Whether a model version (or checkpoint) is there whole: its weights.pt, the file written last."""
    return storage.is_file(storage.join(path, WEIGHTS_FILE))


def version_exists(path: str | Path) -> bool:
    """Whether a version of that name is taken: locally any folder there (versions are renamed in whole), remotely
    a complete version (a killed upload's leftovers are replaced by the next write)."""
    return storage.exists(path) if storage.is_local(path) else is_complete(path)


def _weights_info(path: str | Path):
    import pyarrow.fs as pafs

    fs, inner = storage.filesystem(storage.join(path, WEIGHTS_FILE))
    info = fs.get_file_info(inner)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"no HIR checkpoint at {storage.join(path, WEIGHTS_FILE)}")
    return info


def published_at(path: str | Path) -> float:
    """When a complete version was published (seconds): its folder's time locally (set as its last file was
    written, before the rename), its weights.pt's (the object uploaded last) on a remote store."""
    if storage.is_local(path):
        return storage.local_path(path).stat().st_mtime
    return _weights_info(path).mtime.timestamp()


def list_versions(root: str | Path) -> list[ModelPath]:
    """The complete model versions under a model root, by name. Dot-folders are the trainer's run state and
    atomic-write staging, never a published version."""
    found = [storage.join(root, name) for name in storage.listdir(root) if not name.startswith(".")]
    return [model_path(uri) for uri in found if is_complete(uri)]


def local_model_dir(path: str | Path) -> Path:
    """A local folder holding the complete model version at `path`: the folder itself when local, else a copy in
    storage's cache keyed by the version's name and its weights.pt's size and time (a version rewritten under the
    same name, after a killed upload or a deletion, is never served from an old copy)."""
    if storage.is_local(path):
        return storage.local_path(path)
    info = _weights_info(path)
    return storage.local_copy(path, f"{storage.name(path)}:{info.size}:{info.mtime_ns}")


def load_weights(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """weights.pt of a model directory (or the local file itself), loaded with weights_only=True."""
    path = local_model_dir(path)
    weights_file = path / WEIGHTS_FILE if path.is_dir() else path
    if not weights_file.exists():
        raise FileNotFoundError(f"no HIR checkpoint at {weights_file}")
    try:
        state = torch.load(weights_file, map_location=map_location, weights_only=True)
    except Exception as err:  # UnpicklingError, RuntimeError (not a zip), EOFError (truncated) ...
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"checkpoint {weights_file} is not a weights-only HIR checkpoint: {reason}") from err
    if not isinstance(state, dict) or state.get("format") != WEIGHTS_FORMAT:
        raise ValueError(
            f"checkpoint {weights_file} is not a weights-only HIR checkpoint: no '{WEIGHTS_FORMAT}' format marker"
        )
    if state.get("format_version", 0) > WEIGHTS_FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {weights_file} has format version {state['format_version']}, "
            f"this code reads up to {WEIGHTS_FORMAT_VERSION}"
        )
    return state


def _read_json_file(model_dir: str | Path, name: str) -> str | None:
    """A small file of a version, straight from where it lives; None when it is not there."""
    try:
        return storage.read_text(storage.join(model_dir, name))
    except FileNotFoundError:
        return None


def read_config(model_dir: str | Path) -> tuple[ModelConfig, TrainConfig]:
    text = _read_json_file(model_dir, CONFIG_FILE)
    if text is None:
        raise FileNotFoundError(f"no {CONFIG_FILE} in {model_dir}")
    config = json.loads(text)
    return ModelConfig.from_dict(config["model"]), TrainConfig.from_dict(config["train"])


def read_metrics(model_dir: str | Path) -> list[dict[str, Any]]:
    text = _read_json_file(model_dir, METRICS_FILE)
    return [json.loads(line) for line in (text or "").splitlines() if line.strip()]


def read_summary(model_dir: str | Path) -> dict[str, Any]:
    """The training summary (metrics.jsonl's last record when it is one), {} for a run that did not finish."""
    metrics = read_metrics(model_dir)
    return metrics[-1] if metrics and metrics[-1].get("summary") else {}


def read_lineage(model_dir: str | Path) -> dict[str, Any]:
    text = _read_json_file(model_dir, LINEAGE_FILE)
    return json.loads(text) if text is not None else {}


def load_quantiser(model_dir: str | Path) -> ResidualQuantiser | None:
    path = local_model_dir(model_dir) / QUANTISER_FILE
    return ResidualQuantiser.load(path) if path.exists() else None


@dataclass
class LoadedModel:
    """What the embedding job needs from a model directory: the serving encoder (the student), eval mode."""

    encoder: HIREncoder
    config: ModelConfig
    quantiser: ResidualQuantiser | None
    version: str  # the model directory's name


def load_model(model_dir: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild the serving encoder (the student weights) and the quantiser from a model directory (a remote one
    from its local copy)."""
    version = storage.name(model_dir)
    local = local_model_dir(model_dir)
    model_config, _ = read_config(local)
    weights = load_weights(local, map_location=device)
    encoder = HIREncoder(model_config).to(device)
    encoder.load_state_dict(weights["student"])
    encoder.eval().requires_grad_(False)
    return LoadedModel(encoder, model_config, load_quantiser(local), version)
