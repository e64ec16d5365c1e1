"""Command-line glue: user errors become one line on stderr and exit status 2, no traceback; the
devices and processes are set up first (`devices`); path flags are checked for their kind by `paths`."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Callable, Mapping, Optional

from absl import flags, logging

from patjax.core import compile_cache, devices
from patjax.core.errors import UserError, fraction, one_line


class FractionParser(flags.FloatParser):
    """absl's float parser, which also reads a fraction of two numbers (8/255), the way L-inf
    radii and steps are written; a value it cannot read is refused in one line (a UserError is a
    ValueError, which absl reports as the flag's bad value)."""

    def parse(self, argument):
        return super().parse(fraction(argument) if isinstance(argument, str) and "/" in argument else argument)


def define_fraction(name: str, default, help_text: str) -> None:
    """A float flag that also takes a fraction (`FractionParser`)."""
    flags.DEFINE(FractionParser(), name, default, help_text)


def guarded(main: Callable) -> Callable:
    def wrapped(argv):
        try:
            devices.initialize_distributed()
            devices.use_cpu_cores_as_devices()
            compile_cache.enable()
            return main(argv)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted; the latest complete checkpoint is kept", file=sys.stderr)
            sys.exit(130)

    return wrapped


@contextlib.contextmanager
def named_as_flags(settings: Mapping[str, str]):
    """Within it, a UserError about a setting that came from a flag names the flag the user
    typed: {"eval.pr.samples": "pr_samples"} turns `eval.pr.samples must be ...` into
    `--pr_samples must be ...`. The settings' own checks name the field, which is what a caller
    of the library or a config file set; on a command line that name was never typed."""
    try:
        yield
    except UserError as error:
        message = str(error)
        for setting, flag in settings.items():
            if message.startswith((f"{setting} ", f"{setting}=")):
                raise type(error)(f"--{flag}{message[len(setting) :]}") from None
        raise


def given(*names: str) -> list:
    """The flags among `names` that the command line sets."""
    return [name for name in names if flags.FLAGS[name].present]


def stop_time(max_minutes: Optional[float]) -> Optional[float]:
    """When --max_minutes=M, counted from now, runs out (`time.time()`), or None without it: a
    session's or a job's time limit, at which training stops with a checkpoint and leaves."""
    if max_minutes is None:
        return None
    if not (max_minutes > 0 and math.isfinite(max_minutes)):
        raise UserError(f"--max_minutes must be a positive number of minutes, got {max_minutes}")
    return time.time() + 60 * max_minutes


def start(argv) -> None:
    """What every command line does first: no positional arguments, and Orbax's and JAX's
    INFO lines kept out of the way unless --verbosity asks for them."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def parse_flags(argv):
    """absl's flag parsing, with a config file that cannot be loaded (a missing path, a field
    the config does not have, a value of the wrong type) reported in one line, exit 2.

    ml_collections' config flags load the file and apply `--config.x=...` overrides while absl
    parses the command line, before `main` (and `guarded`) run, and raise plain Python errors
    there (or, for a missing file, leave a stand-in that raises on first use). absl's own flag
    errors (an unknown flag, a value of the wrong type) are reported the same way.
    """
    # A console script's (patjax-train's) main module is its wrapper, not the patjax module that
    # defined the flags; --helpshort lists the main module's key flags, so they are made its own.
    for module, defined in list(flags.FLAGS.flags_by_module_dict().items()):
        if module.startswith("patjax."):
            for flag in defined:
                flags.FLAGS.register_key_flag_for_module(argv[0], flag)
    try:
        args = flags.FLAGS(argv)
        config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
        if config is not None:
            config.keys()  # a config that failed to load is a stand-in that raises on any use
        return args
    except flags.Error as error:
        # absl wraps a ValueError from a flag's parser, and UserError is one: the config file's
        # loader's own line names the file and what is wrong, without absl's frame around it.
        cause = error.__cause__ or error.__context__
        if isinstance(cause, UserError):
            print(f"error: {cause}", file=sys.stderr)
        else:
            print(f"error: {one_line(error)} (--helpshort lists the flags)", file=sys.stderr)
        sys.exit(2)
    except UserError as error:  # a config file that the command's own loader refuses
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except (AttributeError, KeyError) as error:
        exit_unknown_field(argv, error)
    except (OSError, TypeError, ValueError, SyntaxError) as error:
        exit_config_error(error)


@contextlib.contextmanager
def defining_config_flags(argv):
    """Around the definition of a config-dict flag (`config_flags.DEFINE_config_dict`), which reads
    its `--NAME.a.b=` overrides' paths from the command line as it is defined: a field the block
    does not have is one line, exit 2, as at parsing (`exit_unknown_field`)."""
    try:
        yield
    except (AttributeError, KeyError) as error:
        exit_unknown_field(argv, error)


def exit_unknown_field(argv, error) -> None:
    """An override of a config flag (--config.x, --eval.pr.x) naming a field the config does not
    have, in one line with ml_collections' suggestion, exit 2; another error as a config that
    failed to load."""
    unknown = unknown_override(argv, error)
    if unknown is None:
        exit_config_error(error)
    suggestion = " ".join(config_error_text(error).splitlines()[1:])  # ml_collections' "Did you mean ..."
    flag, path = unknown
    field = path if flag == "config" else f"{flag}.{path}"
    print(
        f"error: --{flag}.{path}: the config has no field {field}{'; ' if suggestion else ''}{suggestion}",
        file=sys.stderr,
    )
    sys.exit(2)


def config_error_text(error) -> str:
    """The message of ml_collections' AttributeError or KeyError for a missing field, which may
    wrap a KeyError whose own first argument is the text ("'name'\nDid you mean ...")."""
    inner = error.args[0] if error.args else ""
    if isinstance(inner, BaseException):
        inner = inner.args[0] if inner.args else ""
    return str(inner)


def unknown_override(argv, error) -> tuple | None:
    """(flag, path) of the `--config.a.b=...` or `--eval.a.b=...` override whose path holds the
    field an AttributeError or KeyError of ml_collections names (the config has no such field), or None."""
    missing = (config_error_text(error).splitlines() or [""])[0].strip("'\"")
    for arg in argv[1:]:
        for flag in ("config", "eval"):
            if arg.startswith(f"--{flag}."):
                path = arg[len(f"--{flag}.") :].split("=")[0]
                if missing in path.split("."):
                    return flag, path
    return None


def exit_config_error(error) -> None:
    """A config that failed to load, in one line, exit 2."""
    detail = one_line(error) or type(error).__name__
    print(f"error: cannot load the config given on the command line: {type(error).__name__}: {detail}", file=sys.stderr)
    sys.exit(2)
