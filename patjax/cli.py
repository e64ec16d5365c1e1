"""Command-line glue: user errors become one line on stderr and exit status 2, no traceback."""
from __future__ import annotations

import sys
from typing import Callable

from patjax.errors import UserError


def guarded(main: Callable) -> Callable:
    def wrapped(argv):
        try:
            return main(argv)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted; the latest complete checkpoint is kept", file=sys.stderr)
            sys.exit(130)
    return wrapped
