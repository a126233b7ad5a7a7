"""Self-supervised cross-view distillation (DINO, Caron et al. 2021).

Small named functions, as in DINO's main_dino.py: the head, the loss, centering, the EMA update, the schedules and
the collapse check. The retrieval objective is hir_model.objective.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class DINOHead(nn.Module):
    """LayerNorm -> MLP -> L2 norm -> prototype layer: (B, in_dim) -> (B, K) cosine logits.

    The prototype layer is weight-normalised with its gain fixed to 1 (DINO's norm_last_layer=True), written out
    as a cosine between the normalised bottleneck and the normalised prototype rows.
    """

    def __init__(self, in_dim: int, num_prototypes: int, hidden: int = 512, bottleneck: int = 64) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            # The embedding is unit-norm (per-dim scale 1/sqrt(dim)); DINO's head reads backbone features at unit
            # per-dim scale. Without this the MLP's biases swamp the input and every row gets the same logits.
            nn.LayerNorm(in_dim),
            nn.Linear(in_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, bottleneck),
        )
        self.prototypes = nn.Parameter(torch.empty(num_prototypes, bottleneck))
        for module in self.mlp:
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)  # DINO's init
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.prototypes)

    def forward(self, embedding: Tensor) -> Tensor:
        z = F.normalize(self.mlp(embedding), dim=-1)  # (B, bottleneck)
        return z @ F.normalize(self.prototypes, dim=-1).T  # (B, K)


def distillation_loss(
    student_logits: Tensor, teacher_logits: Tensor, center: Tensor, student_temp: float, teacher_temp: float
) -> Tensor:
    """Cross-entropy between the centred, sharpened teacher distribution and the student's, averaged over rows.

    Equals ln K when both distributions are uniform; the teacher side carries no gradient.
    """
    teacher_probs = F.softmax((teacher_logits - center) / teacher_temp, dim=-1).detach()
    student_log_probs = F.log_softmax(student_logits / student_temp, dim=-1)
    return -(teacher_probs * student_log_probs).sum(dim=-1).mean()


@torch.no_grad()
def update_center(center: Tensor, teacher_logits: Tensor, momentum: float) -> Tensor:
    """EMA of the teacher's mean logits (DINO centering): stops one prototype from winning every row."""
    return center * momentum + teacher_logits.mean(dim=0) * (1.0 - momentum)


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """teacher <- momentum * teacher + (1 - momentum) * student, parameter by parameter (in place)."""
    for teacher_param, student_param in zip(teacher.parameters(), student.parameters(), strict=True):
        teacher_param.mul_(momentum).add_(student_param.detach(), alpha=1.0 - momentum)


def cosine_schedule(base: float, final: float, step: int, total: int) -> float:
    """Cosine from `base` at step 0 to `final` at step `total` (and after); DINO's momentum schedule."""
    progress = min(max(step, 0), total) / max(total, 1)
    return final - (final - base) * (math.cos(math.pi * progress) + 1.0) / 2.0


def teacher_temp_schedule(step: int, warmup_temp: float, final_temp: float, warmup_steps: int) -> float:
    """Linear warm-up of the teacher temperature, then constant (DINO: 0.04 -> 0.07)."""
    if step >= warmup_steps:
        return final_temp
    return warmup_temp + (final_temp - warmup_temp) * step / warmup_steps


@torch.no_grad()
def collapse_report(
    teacher_probs: Tensor,
    loss: float,
    num_prototypes: int,
    embeddings: Tensor | None = None,
    warmed_up: bool = True,
) -> dict[str, float | bool]:
    """Collapse indicators for one batch.

    usage: fraction of the K prototypes that are some row's argmax; mean_entropy: entropy (nats) of the batch-mean
    teacher distribution (ln K when spread evenly); embedding_std: per-dimension std of the embeddings, averaged
    (~1/sqrt(dim) for well spread unit vectors, ~0 when collapsed). `collapsed` is True when the loss sits within 2%
    of ln K after warm-up (uniform collapse) or every row picks the same prototype (one-prototype collapse).
    """
    ln_k = math.log(num_prototypes)
    winners = teacher_probs.argmax(dim=-1).unique().numel()
    mean_probs = teacher_probs.mean(dim=0)
    mean_entropy = float(-(mean_probs * torch.log(mean_probs.clamp_min(1e-12))).sum())
    uniform = warmed_up and abs(loss - ln_k) <= 0.02 * ln_k
    single = teacher_probs.shape[0] > 1 and winners == 1
    report: dict[str, float | bool] = {
        "ln_k": ln_k,
        "usage": winners / num_prototypes,
        "mean_entropy": mean_entropy,
        "collapsed": bool(uniform or single),
    }
    if embeddings is not None:
        report["embedding_std"] = float(embeddings.float().std(dim=0).mean())
    return report
