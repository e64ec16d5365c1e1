"""User-facing errors: the command-line entry points print these as one line and exit non-zero."""


class UserError(Exception):
    """Bad input from the user (config, flags, data directory, workdir)."""


def one_line(error: BaseException) -> str:
    """The error's message with its line breaks and runs of spaces collapsed, for an error that
    is reported as one line (a library's message, quoted inside a `UserError`'s)."""
    return " ".join(str(error).split())
