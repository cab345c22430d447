"""Masking payload fields whose names look like secrets or personal data."""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

_SENSITIVE = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key|credential|auth"
    r"|card([_-]?(number|no|num))?|pan|cvv|cvc|iban|account[_-]?(number|no)|routing[_-]?number"
    r"|ssn|social[_-]?security|tax[_-]?id|national[_-]?id|passport|licen[cs]e[_-]?number"
    r"|e[_-]?mail|phone|mobile|address|street|postcode|zip([_-]?code)?|birth|dob"
    r"|first[_-]?name|last[_-]?name|full[_-]?name|surname)",
    re.IGNORECASE,
)


def is_sensitive(field: str) -> bool:
    """True when a field name suggests a secret or personal data."""
    return bool(_SENSITIVE.search(field))


def mask(value: Any) -> Any:
    """A copy of ``value`` with every sensitive field's value replaced by ``***``."""
    if isinstance(value, dict):
        return {k: MASK if is_sensitive(str(k)) else mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value
