"""User-facing errors: the command-line entry points print these as one line and exit non-zero."""


class UserError(Exception):
    """Bad input from the user (config, flags, data directory, workdir)."""
