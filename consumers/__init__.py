"""The service runtime: workers, inbox deduplication, retries, dead letters. What a
service declares (``Service``, ``HandlerContext``, ``RetryPolicy``, ``StepFailed``) is
imported from :mod:`saga`."""

from saga.consumers.processing import BatchProcessor, Delivery, DeliveryOutcome
from saga.consumers.runner import ServiceRunner
from saga.consumers.worker import ConsumerOptions, Worker

__all__ = [
    "BatchProcessor",
    "ConsumerOptions",
    "Delivery",
    "DeliveryOutcome",
    "ServiceRunner",
    "Worker",
]
