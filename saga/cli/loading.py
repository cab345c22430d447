"""Loading the ``module:object`` a user names on the command line."""

from __future__ import annotations

import importlib
import os
import sys

from saga.engine.registry import SagaRegistry
from saga.errors import ConfigurationError
from saga.handlers.service import Service


def load_object(target: str) -> object:
    """Import ``module:attribute`` (the current directory is importable)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"expected module:object, got {target!r} (e.g. myapp.service:svc)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}") from None


def load_registry(target: str) -> SagaRegistry:
    """Import ``module:registry`` and check that it is a :class:`SagaRegistry`."""
    obj = load_object(target)
    if not isinstance(obj, SagaRegistry):
        raise ConfigurationError(f"{target} is a {type(obj).__name__}, not a saga.SagaRegistry")
    return obj


def load_service(target: str) -> Service:
    """Import ``module:attribute`` and return it as a :class:`Service`.

    An object with an ``as_service()`` method (a saga registry) is accepted
    too. The current directory is importable, as with ``python -m``.
    """
    obj = load_object(target)
    if isinstance(obj, Service):
        return obj
    as_service = getattr(obj, "as_service", None)
    if callable(as_service):
        service = as_service()
        if isinstance(service, Service):
            return service
    raise ConfigurationError(
        f"{target} is a {type(obj).__name__}, not a saga.Service (or saga registry)"
    )
