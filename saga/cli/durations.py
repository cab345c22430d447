"""Parsing ``--since 1h`` style durations."""

from __future__ import annotations

import re
from datetime import timedelta

import typer

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str | None) -> timedelta | None:
    """``90s``, ``15m``, ``1h``, ``2d``, ``1w`` as a timedelta; None stays None."""
    if text is None:
        return None
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration: use e.g. 90s, 15m, 1h, 2d, 1w")
    return timedelta(**{_UNITS[match[2]]: float(match[1])})


def seconds_of(text: str | None) -> float | None:
    duration = parse_duration(text)
    return duration.total_seconds() if duration is not None else None
