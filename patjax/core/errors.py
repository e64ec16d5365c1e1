"""User-facing errors: the command-line entry points print these as one line and exit non-zero."""

import numbers


class UserError(Exception):
    """Bad input from the user (config, flags, data directory, workdir)."""


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
