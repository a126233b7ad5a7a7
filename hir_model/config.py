"""Model and training configuration: every knob of the HIR encoder with its default and the reason for it.

Both configs are frozen dataclasses that round-trip through JSON (`to_dict` / `from_dict`), so a model directory's
`config.json` is enough to rebuild the networks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

ATTENTION_BACKENDS = ("auto", "flex", "sdpa")
BAG_SCOPES = ("neighbourhood", "items")


def _from_dict(cls: type, values: dict[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    return cls(**values)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and self-supervision hyper-parameters of the HIR encoder."""

    # Token features
    id_buckets: int = (
        2**18
    )  # hash trick: 262k rows x dim is ~134 MB at dim 128, large enough for millions of ids
    num_id_hashes: int = (
        2  # two hashes summed (hash embeddings, Svenstrup 2017): a full collision needs both to collide
    )
    dim: int = 128  # embedding dim served downstream; 128 is the usual retrieval/FAISS size
    heads: int = 4  # 32 dims per head
    layers: int = (
        2  # the tree is two hops deep: two layers let hop-2 information reach the target via its parent
    )
    ffn_mult: int = 4  # transformer convention (nanoGPT)
    dropout: float = (
        0.1  # residual/FFN dropout; attention weights are not dropped (flex has no attention dropout)
    )
    max_tokens: int = 64  # longest neighbourhood (target + hop-1 + hop-2) the sampler writes
    max_hop: int = 2  # the sampler writes hops 0, 1, 2
    num_recency_buckets: int = 16  # recency bucket of an edge; larger buckets are clamped to the last one
    content_dim: int = 384  # all-MiniLM-L6-v2 output size; 0 disables content features
    use_content: bool = True  # ablation: ignore content embeddings
    use_attention_bias: bool = True  # ablation: False => zero edge/hop/recency biases
    use_hierarchy_mask: bool = True  # ablation: False => every real token sees every real token
    use_item_bag: bool = True  # add the row's id bag to the embedding (repeat awareness; encoder.item_bag)
    # "neighbourhood": the bag holds every token of the row, with a learned weight per (target type, hop, token
    # type) slot (encoder.neighbourhood_bag: repeats, co-visitation and category affinity); "items": only the
    # items at hops 0-1 (repeats), what models had before the field existed
    bag_scope: str = "neighbourhood"

    # DINO head and distillation
    num_prototypes: int = (
        1024  # K: a few times the number of fine interests we expect; DINO uses 65k for images
    )
    head_hidden: int = 512  # DINO head MLP width (DINO: 2048 for 384-d ViT-S; scaled to our 128-d)
    head_bottleneck: int = 64  # DINO: 256 for ViT; prototypes live on this sphere
    student_temp: float = 0.1  # DINO default
    teacher_temp: float = 0.07  # DINO: final teacher temperature (sharpening)
    teacher_temp_warmup: float = 0.04  # DINO: start sharper, the teacher is noisy early on
    teacher_temp_warmup_steps: int = 1000  # DINO warms up over 30 epochs; here in steps
    center_momentum: float = 0.9  # DINO default centering momentum
    ema_momentum_base: float = 0.996  # DINO: teacher EMA momentum at step 0
    ema_momentum_final: float = 1.0  # DINO: cosine schedule to 1 at the end of training

    # Objectives
    distill_weight: float = 1.0
    retrieval_weight: float = 1.0  # deep-funnel retrieval is what the embedding is judged on; equal weight
    # Softmax temperature for cosine scores (common range 0.05-0.1). 0.1, not 0.05: chosen on each demo dataset's
    # validation split (best recall@50, synthetic 0.646 against 0.621, REES46 0.527 against 0.477, Taobao 0.154
    # against 0.161): at 0.05 the loss could fall to near 0 on a day's pairs, and the validation loss rose 12 -> 19.
    retrieval_temp: float = 0.1
    token_dropout: float = 0.2  # student view: drop 20% of neighbour tokens (with their descendants)
    # Warm starts only: weight of 1 - cosine between the student's embedding of a row and the warm-start model's
    # (Trainer.anchor), so continued training keeps the function consumers were trained on (issue 16)
    stability_weight: float = 0.0

    attention_backend: str = "auto"  # "auto": flex on CUDA, sdpa on CPU; "flex" or "sdpa" to force one

    def __post_init__(self) -> None:
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}"
            )
        if self.bag_scope not in BAG_SCOPES:
            raise ValueError(f"bag_scope must be one of {BAG_SCOPES}, got {self.bag_scope!r}")
        if self.dim % self.heads != 0:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        if self.id_buckets < 2 or self.num_id_hashes < 1:
            raise ValueError("id_buckets must be >= 2 and num_id_hashes >= 1")
        if not 0.0 <= self.token_dropout < 1.0:
            raise ValueError(f"token_dropout must be in [0, 1), got {self.token_dropout}")
        for name in ("retrieval_temp", "student_temp", "teacher_temp", "teacher_temp_warmup"):
            value = getattr(self, name)
            if not 0.0 < value < math.inf:  # also refuses nan: a softmax divides by it
                raise ValueError(f"{name} must be a positive number, got {value}")
        if not self.stability_weight >= 0.0:
            raise ValueError(f"stability_weight must be >= 0, got {self.stability_weight}")
        if self.content_dim < 0:
            raise ValueError(f"content_dim must be >= 0, got {self.content_dim}")

    @property
    def content_enabled(self) -> bool:
        return self.use_content and self.content_dim > 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        # A config written before bag_scope existed is a model with the items-only bag (and no slot weights).
        return _from_dict(cls, {"bag_scope": "items", **values})


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of the trainer."""

    lr: float = 5e-4  # AdamW on a small transformer; DINO uses 5e-4 x batch/256
    min_lr: float = 1e-6  # DINO: cosine decay of the lr to 1e-6 after warm-up
    weight_decay: float = 0.04  # DINO's starting weight decay
    warmup_steps: int = 100  # linear lr warm-up; Adam's moments are noisy in the first steps
    steps: int = 10_000  # total optimisation steps (sets the EMA momentum schedule's length)
    batch_size: int = 512  # in-batch softmax gets more negatives with bigger batches
    grad_clip: float = 3.0  # DINO's clip_grad
    seed: int = 0
    checkpoint_every: int = 0  # save a step-NNNNNNNN directory every N steps; 0 = only at the end

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        return _from_dict(cls, values)
