"""Placeholder replaced by the diagnostics work (issue 5): folds user.* events per function."""

from __future__ import annotations


def summarize_user_compiles(events: list[dict]) -> list[dict]:
    return []
