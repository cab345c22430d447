"""The service runtime: handlers, inbox deduplication, retries, dead letters."""

from saga.consumers.processing import BatchProcessor, Delivery, Outcome
from saga.consumers.runner import ServiceRunner
from saga.consumers.worker import ConsumerOptions, Worker
from saga.errors import StepFailed
from saga.handlers.context import HandlerContext
from saga.handlers.retry import RetryPolicy
from saga.handlers.service import Service

__all__ = [
    "BatchProcessor",
    "ConsumerOptions",
    "Delivery",
    "HandlerContext",
    "Outcome",
    "RetryPolicy",
    "Service",
    "ServiceRunner",
    "StepFailed",
    "Worker",
]
