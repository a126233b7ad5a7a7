"""The collapse verdict: from the run's last tenth, and from the day's embeddings and winning prototypes."""

from __future__ import annotations

import pytest
import torch

from hir_model.verdict import collapse_verdict, day_verdict

HEALTHY = [{"collapsed": False, "distill": 1.0, "usage": 0.5, "ln_k": 2.77}] * 20


def test_collapse_verdict_reads_the_last_tenth_of_the_run() -> None:
    assert collapse_verdict(HEALTHY)[0] is False
    late = HEALTHY[:18] + [dict(HEALTHY[0], collapsed=True)] * 2
    assert collapse_verdict(late)[0] is True  # the whole last tenth flagged
    blip = [dict(HEALTHY[0], collapsed=True)] * 2 + HEALTHY[2:]
    assert collapse_verdict(blip)[0] is False  # early steps near ln K are not a collapse


def test_day_verdict_flags_one_prototype_for_every_entity() -> None:
    spread = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    many = torch.arange(40) % 4
    healthy = day_verdict(HEALTHY, spread, many, 16, distillation=True)
    assert healthy.collapsed is False
    assert healthy.prototype_usage == pytest.approx(4 / 16)
    one = day_verdict(HEALTHY, spread, torch.zeros(40, dtype=torch.long), 16, distillation=True)
    assert one.collapsed is True and "same prototype" in one.detail


def test_day_verdict_without_distillation_checks_the_embeddings_spread_only() -> None:
    one_winner = torch.zeros(40, dtype=torch.long)  # the untrained head says nothing without distillation
    spread = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    assert day_verdict([], spread, one_winner, 16, distillation=False).collapsed is False
    shrunk = torch.ones(40, 8) + 1e-5 * spread  # every entity at (almost) one point
    verdict = day_verdict([], shrunk, one_winner, 16, distillation=False)
    assert verdict.collapsed is True and verdict.embedding_std < 1e-3
