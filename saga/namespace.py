"""One importable name per module: the repository's top-level folders ``consumers/``,
``outbox_relay/`` and ``examples/`` install as ``saga.consumers``, ``saga.outbox_relay``
and ``saga.examples`` (pyproject's ``package-dir``, in the wheel and in an editable
install alike).

From a checkout's root, where the working folder is on ``sys.path``, their bare names
would import too, as second copies of the same modules (two ``Worker`` classes, two
registries of everything module-level). Each folder's ``__init__`` calls
:func:`refuse_bare_name`, so the bare name fails at once and says which import to write.
"""

from __future__ import annotations


def refuse_bare_name(name: str, installed_as: str) -> None:
    """Raise :class:`ImportError` unless the package loading is ``installed_as`` (its
    ``__name__`` is ``name``)."""
    if name != installed_as:
        raise ImportError(
            f"{name!r} is the folder of {installed_as!r} in a checkout: import "
            f"{installed_as} (a second name would load its modules twice)",
            name=name,
        )
