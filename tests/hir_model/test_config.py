from __future__ import annotations

import json

import pytest

from hir_model.config import ModelConfig, TrainConfig


def test_configs_round_trip_through_json() -> None:
    model = ModelConfig(dim=64, heads=4, attention_backend="sdpa", use_content=False)
    train = TrainConfig(lr=1e-3, steps=7, seed=3)
    assert ModelConfig.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    assert TrainConfig.from_dict(json.loads(json.dumps(train.to_dict()))) == train


def test_unknown_field_and_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown ModelConfig fields: colour"):
        ModelConfig.from_dict({"colour": 1})
    with pytest.raises(ValueError, match="attention_backend"):
        ModelConfig(attention_backend="xformers")
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(dim=30, heads=4)
    # A softmax temperature divides the scores: zero, negative or nan would give infinities at the first step.
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="retrieval_temp must be a positive number"):
            ModelConfig(retrieval_temp=bad)
    with pytest.raises(ValueError, match="teacher_temp must be a positive number"):
        ModelConfig.from_dict({"teacher_temp": 0})


def test_content_can_be_switched_off_two_ways() -> None:
    assert ModelConfig().content_enabled
    assert not ModelConfig(content_dim=0).content_enabled
    assert not ModelConfig(use_content=False).content_enabled
