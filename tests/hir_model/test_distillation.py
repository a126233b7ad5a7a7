from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hir_model.distillation import (
    DINOHead,
    collapse_report,
    cosine_schedule,
    distillation_loss,
    ema_update,
    teacher_temp_schedule,
    update_center,
)


def test_uniform_teacher_and_student_give_ln_k() -> None:
    k = 32
    logits = torch.zeros(4, k)
    loss = distillation_loss(logits, logits, torch.zeros(k), student_temp=0.1, teacher_temp=0.04)
    assert loss.item() == pytest.approx(math.log(k), abs=1e-5)


def test_loss_gradient_moves_the_student_towards_the_teacher() -> None:
    k = 8
    teacher = torch.full((2, k), -1.0)
    teacher[:, 3] = 1.0  # the teacher is sure about prototype 3
    student = torch.zeros(2, k, requires_grad=True)
    loss = distillation_loss(student, teacher, torch.zeros(k), 0.1, 0.04)
    loss.backward()
    assert (student.grad[:, 3] < 0).all(), "gradient descent must raise the teacher's prototype"
    assert (student.grad[:, [0, 1, 2, 4]] > 0).all()
    stepped = (student - 1.0 * student.grad).detach()
    assert distillation_loss(stepped, teacher, torch.zeros(k), 0.1, 0.04) < loss


def test_centering_removes_a_prototype_that_wins_every_row() -> None:
    k = 4
    teacher = torch.tensor([[5.0, 0.0, 0.0, 0.0], [5.0, 1.0, 0.0, 0.0]])
    center = update_center(torch.zeros(k), teacher, momentum=0.9)
    torch.testing.assert_close(center, 0.1 * teacher.mean(dim=0))
    center = update_center(center, teacher, momentum=0.0)
    torch.testing.assert_close(center, teacher.mean(dim=0))
    centred_probs = F.softmax((teacher - center) / 0.04, dim=-1)
    assert centred_probs.argmax(dim=-1)[1] == 1, "after centering prototype 0 no longer dominates row 1"


def test_ema_update_is_a_convex_step_and_touches_only_the_teacher() -> None:
    teacher, student = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torch.no_grad():
        teacher.weight.fill_(1.0)
        student.weight.fill_(3.0)
    student_before = student.weight.clone()
    ema_update(teacher, student, momentum=0.75)
    torch.testing.assert_close(teacher.weight, torch.full((2, 3), 0.75 * 1.0 + 0.25 * 3.0))
    assert torch.equal(student.weight, student_before)
    ema_update(teacher, student, momentum=1.0)
    torch.testing.assert_close(teacher.weight, torch.full((2, 3), 1.5))


def test_schedules_hit_their_end_points() -> None:
    assert cosine_schedule(0.996, 1.0, 0, 100) == pytest.approx(0.996)
    assert cosine_schedule(0.996, 1.0, 50, 100) == pytest.approx(0.998)
    assert cosine_schedule(0.996, 1.0, 100, 100) == pytest.approx(1.0)
    assert cosine_schedule(0.996, 1.0, 500, 100) == pytest.approx(1.0)
    assert teacher_temp_schedule(0, 0.04, 0.07, 10) == pytest.approx(0.04)
    assert teacher_temp_schedule(5, 0.04, 0.07, 10) == pytest.approx(0.055)
    assert teacher_temp_schedule(10, 0.04, 0.07, 10) == pytest.approx(0.07)


def test_head_gives_cosine_logits_over_k_prototypes() -> None:
    head = DINOHead(in_dim=16, num_prototypes=10, hidden=32, bottleneck=8)
    logits = head(F.normalize(torch.randn(5, 16), dim=-1))
    assert logits.shape == (5, 10)
    assert logits.abs().max() <= 1.0 + 1e-6
    with torch.no_grad():
        head.prototypes.mul_(100.0)  # weight norm: the prototypes' scale does not matter
    assert head(F.normalize(torch.randn(5, 16), dim=-1)).abs().max() <= 1.0 + 1e-6


def test_collapse_report_flags_uniform_and_single_prototype_collapse() -> None:
    k = 16
    spread = torch.eye(k)[torch.arange(8)]  # 8 rows, 8 different winners
    healthy = collapse_report(spread, loss=1.0, num_prototypes=k, embeddings=torch.randn(8, 4))
    assert healthy["usage"] == pytest.approx(0.5) and not healthy["collapsed"]
    assert healthy["ln_k"] == pytest.approx(math.log(k)) and healthy["embedding_std"] > 0.5
    assert healthy["mean_entropy"] == pytest.approx(math.log(8), abs=1e-5)
    one_winner = torch.eye(k)[torch.zeros(8, dtype=torch.long)]
    assert collapse_report(one_winner, loss=1.0, num_prototypes=k)["collapsed"]
    uniform_loss = math.log(k) * 1.01
    assert collapse_report(spread, loss=uniform_loss, num_prototypes=k)["collapsed"]
    assert not collapse_report(spread, loss=uniform_loss, num_prototypes=k, warmed_up=False)["collapsed"]
