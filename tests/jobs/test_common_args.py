"""Flag values shared by several jobs."""

from __future__ import annotations

import pytest

from jobs.common.args import parse_stage_weights
from jobs.common.errors import HirError


def test_stage_weights_need_every_funnel_stage_once_with_a_positive_weight() -> None:
    assert parse_stage_weights("purchase=5,cart=3,favourite=2,view=1.5", "--stage-weights") == {
        "purchase": 5.0,
        "cart": 3.0,
        "favourite": 2.0,
        "view": 1.5,
    }
    with pytest.raises(HirError, match="^--stage-weights: no weight for cart"):
        parse_stage_weights("view=1,favourite=2,purchase=5", "--stage-weights")
    with pytest.raises(HirError, match="^--positive-weights: weight of view must be positive"):
        parse_stage_weights("view=0,favourite=2,cart=3,purchase=5", "--positive-weights")
    with pytest.raises(HirError, match="does not name a new stage"):
        parse_stage_weights("view=1,view=2,cart=3,purchase=5", "--stage-weights")
    with pytest.raises(HirError, match="no number after"):
        parse_stage_weights("view=x,favourite=2,cart=3,purchase=5", "--stage-weights")
