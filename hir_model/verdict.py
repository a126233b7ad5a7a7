"""Did training give a usable representation? The collapse verdict, from the run's loss history and from the
day's served embeddings (one prototype for every entity, or every embedding shrunk to one point).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hir_model.data import NeighbourhoodRows, row_batches
from hir_model.trainer import Trainer

# Mean per-dimension std of the day's embeddings below which they have shrunk to one point (well spread unit
# vectors of dim d have ~1/sqrt(d), 0.18 at d=32, 0.09 at d=128).
_MIN_EMBEDDING_STD = 1e-3
_EMBED_BATCH = 1024  # rows per forward pass when embedding the day (inference only: no activations kept)


def collapse_verdict(history: list[dict[str, Any]]) -> tuple[bool, str]:
    """A run collapsed when most steps of its last tenth are flagged by collapse_report (distillation loss at
    ln K after the teacher warm-up, or one prototype for every row)."""
    if not history:
        return False, "no steps"
    window = history[-max(1, len(history) // 10) :]
    flagged = sum(bool(m.get("collapsed")) for m in window)
    distill = sum(m["distill"] for m in window) / len(window)
    usage = sum(m["usage"] for m in window) / len(window)
    detail = (
        f"{flagged} of the last {len(window)} steps flagged; distill {distill:.4f} vs ln K "
        f"{window[-1]['ln_k']:.4f}, prototype usage {usage:.4f}"
    )
    return flagged * 2 > len(window), detail


@torch.no_grad()
def embed_day(trainer: Trainer, rows: NeighbourhoodRows, content) -> tuple[torch.Tensor, torch.Tensor]:
    """Served embeddings (N, dim) of every row, and each row's winning prototype (centred, as in training)."""
    embeddings, prototypes = [], []
    trainer.student_head.eval()
    for batch in row_batches(rows, _EMBED_BATCH, content):
        embedding = trainer.embed(batch)
        logits = trainer.student_head(embedding) - trainer.center
        embeddings.append(embedding.float().cpu())
        prototypes.append(logits.argmax(dim=-1).cpu())
    return torch.cat(embeddings), torch.cat(prototypes)


@dataclass(frozen=True)
class DayVerdict:
    collapsed: bool
    detail: str
    prototype_usage: float  # share of the prototypes that win at least one of the day's entities
    embedding_std: float  # mean per-dimension std of the day's embeddings


def day_verdict(
    history: list[dict[str, Any]],
    embeddings: torch.Tensor,
    winners: torch.Tensor,
    num_prototypes: int,
    distillation: bool,
) -> DayVerdict:
    """The run's verdict from its history and the day's embeddings (N, dim) and winning prototypes (N,)."""
    collapsed, detail = collapse_verdict(history) if distillation else (False, "")
    usage = winners.unique().numel() / num_prototypes
    std = float(embeddings.std(dim=0).mean()) if len(embeddings) > 1 else 0.0
    if len(embeddings) > 1 and winners.unique().numel() == 1:
        collapsed, detail = True, detail + "; every entity of the day has the same prototype"
    if not distillation:
        # Without the distillation term the prototype head is never trained: its loss and usage say nothing.
        # What is left to check is that the embeddings themselves did not all shrink to one point.
        collapsed = len(embeddings) > 1 and std < _MIN_EMBEDDING_STD
        detail = f"distillation off: prototype checks skipped; embedding std {std:.4f}"
    return DayVerdict(collapsed, detail, usage, std)
