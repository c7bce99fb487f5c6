"""Timestamps as the API server writes them."""

from __future__ import annotations

from datetime import UTC, datetime


def api_time() -> str:
    """The time now as a metav1.Time (RFC 3339, seconds): conditions, events, annotations."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: float) -> str:
    """A Unix time as a metav1.MicroTime (RFC 3339, microseconds): Lease times."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
