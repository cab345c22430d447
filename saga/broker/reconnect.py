"""Reconnecting after the database or the broker went away, with backoff."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import kombu.exceptions
import psycopg
from kombu import Connection
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_when_event_set,
    wait_exponential,
    wait_random,
)

from saga.errors import PublishNotConfirmed


def close_quietly(logger: logging.Logger, *resources: object) -> None:
    """Close each resource that is not None; a failure to close is logged, never raised."""
    for resource in resources:
        close = getattr(resource, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception:
            logger.debug("closing %r failed", resource, exc_info=True)


def transient_errors(broker_connection: Connection) -> tuple[type[BaseException], ...]:
    """Errors after which reconnecting may help (lost connections, broker channel errors).

    A batch publish that failed midway (kombu's ``BatchPublishError``, e.g. Redis went
    away during the pipeline) has an uncertain outcome: the caller treats it as not
    published (its outbox rows stay) and reconnects; the inbox absorbs a duplicate.
    """
    return (
        psycopg.OperationalError,
        ConnectionError,
        OSError,
        kombu.exceptions.OperationalError,  # kombu's wrapper for "cannot connect"
        kombu.exceptions.BatchPublishError,
        PublishNotConfirmed,
        *broker_connection.connection_errors,
        *broker_connection.channel_errors,
    )


def connect_with_retry(
    connect: Callable[[], None],
    errors: tuple[type[BaseException], ...],
    stop: threading.Event,
    logger: logging.Logger,
) -> None:
    """Call ``connect`` until it succeeds or ``stop`` is set: 0.2 s, doubling to 10 s, jittered."""
    for attempt in Retrying(
        retry=retry_if_exception_type(errors),
        wait=wait_exponential(multiplier=0.2, max=10.0) + wait_random(0, 0.2),
        stop=stop_when_event_set(stop),
        before_sleep=before_sleep_log(logger, logging.WARNING),
        reraise=True,
    ):
        with attempt:
            connect()
