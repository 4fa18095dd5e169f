"""Secrets given in settings: inline, or in a file (the way orchestrators mount them)."""

from __future__ import annotations

from pathlib import Path


def secret(value: str, file: str) -> str:
    """``value`` when set, else the stripped content of ``file`` when named, else empty."""
    if value or not file:
        return value
    return Path(file).read_text().strip()
