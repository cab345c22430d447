"""The service runtime: handlers, inbox deduplication, retries, dead letters."""

from consumers.context import HandlerContext
from consumers.processing import BatchProcessor, Delivery, Outcome
from consumers.retry import RetryPolicy
from consumers.runner import ServiceRunner
from consumers.service import Service
from consumers.worker import ConsumerOptions, Worker
from saga.errors import StepFailed

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
