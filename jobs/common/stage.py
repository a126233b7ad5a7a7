"""Stage accounting: every stage logs rows in/out and wall time as one JSON line."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field


@dataclass
class StageLog:
    """Collects counts during a stage and prints `{"stage": ..., "seconds": ..., ...}` when it ends."""

    stage: str
    counts: dict[str, int | float | str] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def __enter__(self) -> StageLog:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.emit()

    @property
    def seconds(self) -> float:
        return round(time.perf_counter() - self.started, 3)

    def emit(self) -> dict:
        record = {"stage": self.stage, "seconds": self.seconds, **self.counts}
        print(json.dumps(record, default=str), file=sys.stderr, flush=True)
        return record
