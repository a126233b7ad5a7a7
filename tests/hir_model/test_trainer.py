"""The trainer's step: the id table's sparse gradient must give the update a dense table would."""

from __future__ import annotations

import torch

from hir_model.config import ModelConfig, TrainConfig
from hir_model.synthetic import make_synthetic, synthetic_batches
from hir_model.trainer import Trainer


def test_the_sparse_id_gradient_gives_the_dense_tables_update(tiny_config: ModelConfig) -> None:
    data = make_synthetic(num_users=48, views_per_user=(2, 5), max_tokens=16, seed=3)
    batches = list(synthetic_batches(data, batch_size=16, steps=4, seed=0, negatives=8))
    # A large decay, so that a row no step reads still moves measurably: the dense update reaches every row.
    train = TrainConfig(lr=5e-3, steps=4, batch_size=16, warmup_steps=1, seed=7, weight_decay=10.0)
    sparse, dense = Trainer(tiny_config, train, device="cpu"), Trainer(tiny_config, train, device="cpu")
    dense.student.features.id_embedding.sparse = False  # torch's dense embedding gradient: the reference
    start = sparse.student.features.id_embedding.weight.detach().clone()

    users = sparse.student(batches[0].users)
    users.sum().backward()
    assert sparse.student.features.id_embedding.weight.grad.is_sparse, (
        "a lookup must not densify the gradient"
    )
    sparse.optimizer.zero_grad(set_to_none=True)

    for batch in batches:
        sparse.train_step(batch)
        dense.train_step(batch)
    moved = (sparse.student.features.id_embedding.weight.detach() - start).norm(dim=1)  # per bucket
    assert (moved > 1e-4).all(), "AdamW's decay must reach every row, read or not"
    for (name, a), (_, b) in zip(
        sparse.student.named_parameters(), dense.student.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{name} differs from the dense update")
    torch.testing.assert_close(
        sparse.teacher.features.id_embedding.weight, dense.teacher.features.id_embedding.weight
    )
