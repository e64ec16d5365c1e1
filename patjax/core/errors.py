"""User-facing errors: the command-line entry points print these as one line and exit non-zero."""

import numbers


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
