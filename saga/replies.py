"""Framework messages that travel between services."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel


class FailureReply(BaseModel):
    """Sent to ``reply_to`` when a handler raises :class:`~saga.errors.StepFailed`."""

    message_type: ClassVar[str] = "saga.FailureReply"

    reason: str
    code: str | None = None
    failed_type: str
