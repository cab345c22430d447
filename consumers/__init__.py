"""The service runtime: workers, inbox deduplication, retries, dead letters. What a
service declares (``Service``, ``HandlerContext``, ``RetryPolicy``, ``StepFailed``) is
imported from :mod:`saga`."""

from saga.consumers.delivery_batches import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.consumers.runner import ServiceRunner
from saga.consumers.worker import ConsumerOptions, Worker
from saga.namespace import refuse_bare_name

refuse_bare_name(__name__, "saga.consumers")

__all__ = [
    "ConsumerOptions",
    "Delivery",
    "DeliveryBatchProcessor",
    "DeliveryOutcome",
    "ServiceRunner",
    "Worker",
]
