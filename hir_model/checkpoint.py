"""Model directories: one immutable, atomically written folder per model version.

    <version>/weights.pt      plain state dicts only, loadable with torch.load(weights_only=True)
    <version>/config.json     {"model": ModelConfig, "train": TrainConfig}
    <version>/quantiser.pt    BoM codebooks (optional), weights-only too
    <version>/metrics.jsonl   one JSON object per training step
    <version>/lineage.json    what the model was built from (Delta table versions read, ...)

A version is written into a temporary sibling folder and renamed into place, so a reader never sees half a model
and a killed job leaves nothing under the version's name. An existing version is never overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hir_model.config import ModelConfig, TrainConfig
from hir_model.encoder import HIREncoder
from hir_model.quantiser import ResidualQuantiser

WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "config.json"
QUANTISER_FILE = "quantiser.pt"
METRICS_FILE = "metrics.jsonl"
LINEAGE_FILE = "lineage.json"

WEIGHTS_FORMAT = "hir-weights"  # marker inside weights.pt: tells our checkpoints from any other torch file
WEIGHTS_FORMAT_VERSION = 1


def write_model_dir(
    path: str | Path,
    weights: dict[str, Any],
    config: dict[str, Any],
    metrics: list[dict[str, Any]] | None = None,
    lineage: dict[str, Any] | None = None,
    quantiser: ResidualQuantiser | None = None,
) -> Path:
    """Write a model version directory atomically; refuse if the version already exists."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(
            f"model version {path} already exists; versions are immutable, write a new version"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        torch.save(
            {**weights, "format": WEIGHTS_FORMAT, "format_version": WEIGHTS_FORMAT_VERSION},
            staging / WEIGHTS_FILE,
        )
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        with open(staging / METRICS_FILE, "w") as out:
            for row in metrics or []:
                out.write(json.dumps(row, sort_keys=True) + "\n")
        (staging / LINEAGE_FILE).write_text(
            json.dumps(lineage or {}, indent=2, sort_keys=True, default=str) + "\n"
        )
        if quantiser is not None:
            quantiser.save(staging / QUANTISER_FILE)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; readers (Spark executors) may run as another user
        try:
            os.rename(staging, path)
        except OSError as err:  # another writer got there first
            raise FileExistsError(f"model version {path} already exists; versions are immutable") from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def load_weights(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """weights.pt of a model directory (or the file itself), loaded with weights_only=True."""
    path = Path(path)
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


def read_config(model_dir: str | Path) -> tuple[ModelConfig, TrainConfig]:
    config = json.loads((Path(model_dir) / CONFIG_FILE).read_text())
    return ModelConfig.from_dict(config["model"]), TrainConfig.from_dict(config["train"])


def read_metrics(model_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(model_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_summary(model_dir: str | Path) -> dict[str, Any]:
    """The training summary (metrics.jsonl's last record when it is one), {} for a run that did not finish."""
    metrics = read_metrics(model_dir)
    return metrics[-1] if metrics and metrics[-1].get("summary") else {}


def read_lineage(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / LINEAGE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def load_quantiser(model_dir: str | Path) -> ResidualQuantiser | None:
    path = Path(model_dir) / QUANTISER_FILE
    return ResidualQuantiser.load(path) if path.exists() else None


@dataclass
class LoadedModel:
    """What the embedding job needs from a model directory: the serving encoder (the student), eval mode."""

    encoder: HIREncoder
    config: ModelConfig
    quantiser: ResidualQuantiser | None
    version: str  # the model directory's name


def load_model(model_dir: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild the serving encoder (the student weights) and the quantiser from a model directory."""
    model_dir = Path(model_dir)
    model_config, _ = read_config(model_dir)
    weights = load_weights(model_dir, map_location=device)
    encoder = HIREncoder(model_config).to(device)
    encoder.load_state_dict(weights["student"])
    encoder.eval().requires_grad_(False)
    return LoadedModel(encoder, model_config, load_quantiser(model_dir), model_dir.name)
