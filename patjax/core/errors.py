"""User-facing errors: the command-line entry points print these as one line and exit non-zero."""

import math
import numbers

import numpy as np


class UserError(ValueError):
    """Bad input from the user (config, flags, data directory, workdir, the API's arguments). A
    ValueError, so that a caller of the library who catches the standard exception catches it."""


class UserTypeError(UserError, TypeError):
    """Bad input of the wrong type (a string where a number is asked): a TypeError too, as
    Python's own conventions have it."""


def one_line(error: BaseException) -> str:
    """The error's message with its line breaks and runs of spaces collapsed, for an error that
    is reported as one line (a library's message, quoted inside a `UserError`'s)."""
    return " ".join(str(error).split())


def integer(name: str, value, minimum: int, maximum: int | None = None, sentinel: str = "") -> int:
    """value as an int, or a one-line UserError naming the setting, its range and `sentinel` (the
    values outside the range that mean something, said in words)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise UserError(f"{name} must be an integer {bound}{f', or {sentinel}' if sentinel else ''}, got {value!r}")
    return int(value)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def finite_numbers(settings: dict, prefix: str = "") -> None:
    """Every float in a (nested) settings dict is finite in float32, the dtype every setting is
    used in, or a one-line UserError naming it: inf or nan in a step size, weight or epsilon
    would train or evaluate without complaint and give a meaningless number, and 1e39 is a
    finite Python float but inf in float32."""
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            finite_numbers(value, f"{name}.")
            continue
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= FLOAT32_MAX):
                raise UserError(f"{name} must be a finite number in float32 (|x| <= 3.4e38), got {value!r}")


def python_scalars(value):
    """numpy scalars (and sequences of them) as the Python numbers they hold: a caller of the API
    may pass np.int64(100) where 100 is asked, and typed config fields take Python's types."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(python_scalars(v) for v in value)
    return value
