"""End-to-end: a short CPU training on planted hierarchical interests must recover them."""

from __future__ import annotations

import math
import time

import pytest
import torch

from hir_model.config import ModelConfig, TrainConfig
from hir_model.quantiser import ResidualQuantiser, purity
from hir_model.synthetic import make_synthetic, synthetic_batches
from hir_model.trainer import Trainer

# Small enough for ~10 s on one CPU thread. Faster EMA (0.9) and a short teacher warm-up because the run is 100
# steps, not 100k; retrieval weight 0.3 keeps the in-batch softmax from drowning the distillation signal.
MODEL = ModelConfig(
    id_buckets=4096,
    dim=32,
    heads=2,
    layers=2,
    ffn_mult=2,
    dropout=0.0,
    max_tokens=24,
    num_recency_buckets=8,
    content_dim=0,
    num_prototypes=64,
    head_hidden=64,
    head_bottleneck=32,
    teacher_temp_warmup_steps=25,
    ema_momentum_base=0.9,
    retrieval_weight=0.3,
)
TRAIN = TrainConfig(lr=2e-3, steps=100, batch_size=128, warmup_steps=10, seed=0)


def neighbour_agreement(embeddings: torch.Tensor, labels: torch.Tensor, k: int = 10) -> tuple[float, float]:
    """(share of each user's k cosine nearest neighbours with the same label, the share expected by chance)."""
    similarity = embeddings @ embeddings.T
    similarity.fill_diagonal_(-2.0)
    neighbours = similarity.topk(k, dim=1).indices  # (U, k)
    agreement = (labels[neighbours] == labels[:, None]).float().mean().item()
    same = (labels[:, None] == labels[None, :]).float().sum(dim=1) - 1  # other users with the same label
    return agreement, (same / (len(labels) - 1)).mean().item()


@pytest.mark.slow
def test_short_training_recovers_planted_interests() -> None:
    data = make_synthetic(seed=0)
    trainer = Trainer(MODEL, TRAIN, device="cpu")
    started = time.perf_counter()
    history = trainer.fit(synthetic_batches(data, TRAIN.batch_size, TRAIN.steps, seed=1))
    seconds = time.perf_counter() - started

    users = trainer.embed(data.users)
    fine, fine_chance = neighbour_agreement(users, data.user_cluster)
    parent, parent_chance = neighbour_agreement(users, data.user_parent)
    codes = ResidualQuantiser(levels=2, codes_per_level=data.num_clusters, seed=0).fit(users).encode(users)
    level0_purity = purity(codes[:, 0], data.user_parent)
    shuffled = data.user_parent[
        torch.randperm(len(data.user_parent), generator=torch.Generator().manual_seed(0))
    ]
    purity_chance = purity(codes[:, 0], shuffled)
    distill_end = sum(m["distill"] for m in history[-10:]) / 10
    ln_k = math.log(MODEL.num_prototypes)
    print(
        f"\ntrained {len(history)} steps in {seconds:.1f}s | "
        f"fine-cluster NN@10 {fine:.3f} (chance {fine_chance:.3f}) | "
        f"parent NN@10 {parent:.3f} (chance {parent_chance:.3f}) | "
        f"level-0 purity {level0_purity:.3f} (shuffled labels {purity_chance:.3f}) | "
        f"distill {history[0]['distill']:.2f} -> {distill_end:.2f} (ln K {ln_k:.2f}) | "
        f"usage {history[-1]['usage']:.2f}"
    )
    assert fine >= 3 * fine_chance
    assert parent >= 3 * parent_chance
    assert level0_purity >= 2 * purity_chance
    assert distill_end < 0.5 * ln_k
    assert not history[-1]["collapsed"]
