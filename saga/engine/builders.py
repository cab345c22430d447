"""How a remote step's command and compensation are built from the saga's data: a function
of the data, or a message class built from the data's fields of the same names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast, get_type_hints

from pydantic import BaseModel

from saga.errors import ConfigurationError

CommandBuilder = Callable[[Any], BaseModel]


class FieldsBuilder:
    """A message class built from the saga data's fields of the same names."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self.__qualname__ = f"{model.__name__}.from_saga_data"

    def __call__(self, data: BaseModel) -> BaseModel:
        return self.model.model_validate(data.model_dump())

    def missing_fields(self, data_model: type[BaseModel]) -> list[str]:
        """The message's required fields that ``data_model`` has no field for."""
        available = set(data_model.model_fields)
        return [
            field.alias or name
            for name, field in self.model.model_fields.items()
            if field.is_required() and (field.alias or name) not in available
        ]


def as_builder(command: CommandBuilder | type[BaseModel]) -> CommandBuilder:
    if isinstance(command, type) and issubclass(command, BaseModel):
        return FieldsBuilder(command)
    if not callable(command):
        raise ConfigurationError(f"command must be a message class or a function, got {command!r}")
    return cast(CommandBuilder, command)


def message_class(command: object) -> type[BaseModel] | None:
    if isinstance(command, type) and issubclass(command, BaseModel):
        return command
    try:
        hints = get_type_hints(command)
    except Exception:
        return None
    returned = hints.get("return")
    if isinstance(returned, type) and issubclass(returned, BaseModel):
        return returned
    return None
