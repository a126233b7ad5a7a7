"""The one error type a job turns into a one-line message and a non-zero exit.

Defined in hir_model (whose storage layer raises it too, without importing the jobs) and re-exported here, where
the jobs have always taken it from."""

from __future__ import annotations

from hir_model.errors import HirError

__all__ = ["HirError"]
