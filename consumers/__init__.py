"""The service runtime: workers, inbox deduplication, retries, dead letters. What a
service declares (``Service``, ``HandlerContext``, ``RetryPolicy``, ``StepFailed``) is
imported from :mod:`saga`."""

from saga.consumers.processing import BatchProcessor, Delivery, Outcome
from saga.consumers.runner import ServiceRunner
from saga.consumers.worker import ConsumerOptions, Worker
from saga.namespace import refuse_bare_name

refuse_bare_name(__name__, "saga.consumers")

__all__ = [
    "BatchProcessor",
    "ConsumerOptions",
    "Delivery",
    "Outcome",
    "ServiceRunner",
    "Worker",
]
