"""The one error type a job turns into a one-line message and a non-zero exit (jobs.common.errors re-exports it)."""

from __future__ import annotations


class HirError(Exception):
    """A user-facing failure: bad flag, bad path, bad input, refused write. The message is one line."""
