"""Validating what users type (pool options, ``Image``, provider options) with pydantic.

Each option model lives beside what it configures (:mod:`skyward.pool.options` for the pool,
:mod:`skyward._image_fields`, :mod:`skyward.providers._ssh_options`,
:mod:`skyward.providers.aws._options`); this module holds what they share:

1. :func:`validate` runs a model and turns the first failure into
   :class:`~skyward.errors.ConfigError` — never a raw ``pydantic.ValidationError``. The
   parameter is the failing location (``plugins[1]``, ``hosts[0]``, ``env['A']``), ``accepted``
   comes from the failing check (:func:`reject`) or else the field's ``description``, and
   ``got`` is the value given (masked where a check asked for it).
2. A ``ConfigError`` raised inside a check (e.g. by :func:`~skyward.accelerators.parse_accelerator`)
   comes out unchanged.
3. Reusable field types: :data:`Seconds` (finite, > 0), :data:`Count` (integer >= 1),
   :data:`Flag` (a real bool), :func:`strings` (a list of non-empty strings).

pydantic costs ~130 ms to import, more than the whole of ``import skyward``: this module and
the models are imported on first validation, never by ``import skyward`` (or the worker).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Annotated, Any, NoReturn, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from skyward.errors import ConfigError

__all__ = ["STRICT", "Count", "Flag", "Seconds", "reject", "strings", "validate"]

M = TypeVar("M", bound=BaseModel)

#: Model settings shared by every option model: values are frozen, types are not coerced
#: ("2" is not 2, True is not 1), unknown names are refused, and pydantic's own text never
#: shows an input (a secret may be one).
STRICT = ConfigDict(frozen=True, strict=True, extra="forbid", arbitrary_types_allowed=True,
                    hide_input_in_errors=True)

_NO_VALUE = object()


def reject(accepted: str, got: Any = _NO_VALUE, detail: str = "") -> NoReturn:
    """Fail the current check: ``accepted`` says what would pass, ``got`` replaces the shown value."""
    ctx: dict[str, Any] = {"accepted": accepted, "detail": detail}
    if got is not _NO_VALUE:
        ctx["got"] = got
    raise PydanticCustomError("skyward_config", "expected {accepted}", ctx)


def validate(model: type[M], values: dict[str, Any]) -> M:
    """``model(**values)``, with a failure raised as :class:`ConfigError` (see the module docstring)."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise _config_error(model, exc) from None  # pydantic's chain would show the input


def _config_error(model: type[BaseModel], exc: ValidationError) -> ConfigError:
    error = exc.errors(include_url=False)[0]
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, ConfigError):
        return cause
    loc = error["loc"]
    field = model.model_fields.get(str(loc[0])) if loc else None
    parameter = _parameter(loc)
    accepted = ctx.get("accepted") or (field.description if field is not None else None) or error["msg"]
    got = ctx["got"] if "got" in ctx else error.get("input")
    if error["type"] == "extra_forbidden":
        accepted = "one of " + ", ".join(sorted(model.model_fields))
        got = parameter
    return ConfigError(parameter, accepted, got, detail=ctx.get("detail", ""))


def _parameter(loc: tuple[int | str, ...]) -> str:
    """``("plugins", 1)`` -> ``plugins[1]``; ``("env", "A")`` -> ``env['A']``."""
    if not loc:
        return "options"
    out = str(loc[0])
    for part in loc[1:]:
        if part == "[key]":  # pydantic's marker for "the key itself, not its value"
            continue
        out += f"[{part!r}]" if isinstance(part, str) else f"[{part}]"
    return out


# -- shared field types ---------------------------------------------------------------------------


#: Seconds: an int or float, finite and > 0 (``inf`` and ``nan`` are refused).
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, description="a positive number of seconds (not inf or nan)")]
#: A count: an int >= 1 (not a bool, not a string).
Count = Annotated[int, Field(ge=1, description="an integer >= 1")]
#: A real ``True`` or ``False`` (not "no", not 0).
Flag = Annotated[bool, Field(description="True or False")]


def _as_list(value: Any, accepted: str, *, paths: bool) -> list[Any]:
    """Any iterable except a lone string (which would otherwise be split into characters)."""
    lone = (str, bytes, os.PathLike) if paths else (str, bytes)
    if isinstance(value, lone):
        shown = os.fspath(value) if isinstance(value, os.PathLike) else value
        reject(accepted, value, detail=f"pass a list, e.g. [{shown!r}]")
    if not isinstance(value, Iterable):
        reject(accepted, value)
    return list(value)


def strings(accepted: str, *, each: str | None = None, check: Callable[[str], Any] | None = None,
            unique: bool = False, paths: bool = False) -> Any:
    """A field type: a list of non-empty, stripped strings, kept as a tuple.

    ``accepted`` describes the list, ``each`` one item (default: ``accepted``); ``check`` runs
    on every stripped item and may :func:`reject` it; ``unique`` drops repeats (first wins);
    ``paths`` also takes ``os.PathLike`` items. A bad item is reported at its index (``pip[2]``).
    """
    item_accepted = each or accepted

    def item(value: Any) -> str:
        if paths and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            reject(item_accepted, value)
        text = value.strip()
        if check is not None:
            check(text)
        return text

    def as_tuple(value: list[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(value)) if unique else tuple(value)

    return Annotated[
        list[Annotated[Any, AfterValidator(item)]],
        BeforeValidator(lambda v: _as_list(v, accepted, paths=paths)),
        AfterValidator(as_tuple),
        Field(description=accepted),
    ]
