"""How an exception is written down: its type name, its message and its formatted traceback,
each made safe to store. Used for activity attempts and for the workflow's own failure.

An exception's text is not trusted: its ``__str__`` may raise, and it may hold a NUL or a lone
surrogate, which Postgres cannot store — any of which would otherwise make the failure itself
fail to be recorded (a poison run). Tracebacks are bounded: the innermost frames are kept."""

from __future__ import annotations

import traceback as _traceback
from dataclasses import dataclass

MAX_TRACEBACK_CHARS = 16_000
MAX_MESSAGE_CHARS = 4_000


@dataclass(frozen=True)
class ErrorInfo:
    error_type: str
    message: str
    traceback: str = ""


def safe_text(text: str, limit: int) -> str:
    """``text`` with what Postgres cannot store replaced (NUL, lone surrogates), cut to
    ``limit`` characters keeping the end (where a traceback's innermost frame is)."""
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        cut = len(text) - limit
        text = f"[{cut} characters cut]\n" + text[-limit:]
    return text


def describe(exc: BaseException, *, with_traceback: bool = True) -> ErrorInfo:
    try:
        message = str(exc)
    except Exception as err:  # noqa: BLE001 - a broken __str__ must not hide the failure
        message = f"<str() of the exception raised {type(err).__name__}>"
    tb = ""
    if with_traceback and exc.__traceback__ is not None:
        try:
            tb = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:  # noqa: BLE001 - the same broken __str__ can break the formatter
            tb = "".join(_traceback.format_tb(exc.__traceback__))
    return ErrorInfo(
        safe_text(type(exc).__name__, 200),
        safe_text(message, MAX_MESSAGE_CHARS),
        safe_text(tb, MAX_TRACEBACK_CHARS),
    )
