"""How an exception crosses the wire: rebuilt as its own type when possible, else RemoteError."""

from __future__ import annotations

import pickle
import traceback as tb_module
from typing import Any

import cloudpickle

from skyward.errors import RemoteError

NOTE_PREFIX = "remote traceback"


def encode_exception(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    text = "".join(tb_module.format_exception(exc))
    try:
        pickled: bytes | None = cloudpickle.dumps(exc, protocol=5)
        pickle.loads(pickled)  # a type whose pickle can't be loaded even here is no better
    except Exception:
        pickled = None
    try:
        message = str(exc)
    except Exception:
        message = f"<unprintable {cls.__name__}>"
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": message,
        "traceback": text,
        "pickled": pickled,
    }


def decode_exception(data: dict[str, Any], node: int | None) -> BaseException:
    """Rebuild the remote exception with the remote traceback attached as a note.

    The rebuilt exception also carries ``remote_traceback`` and ``node`` attributes when it
    accepts them. Falls back to :class:`RemoteError` when the type cannot be rebuilt here.
    """
    exc: BaseException | None = None
    if data.get("pickled") is not None:
        try:
            exc = pickle.loads(data["pickled"])
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        return RemoteError(data["type"], data["message"], data["traceback"], node=node)
    where = f" (node {node})" if node is not None else ""
    try:
        exc.add_note(f"{NOTE_PREFIX}{where}:\n{data['traceback'].rstrip()}")
    except Exception:
        pass
    for attr, value in (("remote_traceback", data["traceback"]), ("node", node)):
        if not hasattr(exc, attr):
            try:
                setattr(exc, attr, value)
            except Exception:
                pass
    return exc
