"""User-facing errors: the command-line entry points print these as one line and exit non-zero."""

import dataclasses
import math
import numbers
import sys
from typing import Optional

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


INT32_MAX = 2**31 - 1  # jitted loop counters, sample indices and the train state's step are int32


@dataclasses.dataclass(frozen=True)
class Range:
    """An integer setting's declared range: [minimum, maximum], and optionally one value outside it
    that means something (`sentinel`, said in words by `meaning`)."""

    name: str  # the setting as a user writes it: the config field (`langevin.steps`, `eval.seed`)
    minimum: int
    maximum: int
    sentinel: Optional[int] = None
    meaning: str = ""


def count(name: str, minimum: int, maximum: int, *, default=dataclasses.MISSING, sentinel=None, meaning=""):
    """A settings dataclass's integer field with its range declared beside it: `check_counts`
    checks it, and the tests derive their table of bounds from the declarations (`declared_counts`),
    so a count cannot be added without a range."""
    return dataclasses.field(default=default, metadata={"range": Range(name, minimum, maximum, sentinel, meaning)})


def declared_counts(settings_type) -> dict[str, Range]:
    """{field: its Range} of a settings dataclass."""
    return {f.name: f.metadata["range"] for f in dataclasses.fields(settings_type) if "range" in f.metadata}


def check_counts(settings) -> None:
    """Each declared count of a frozen settings dataclass, in its range or its sentinel, stored as a
    Python int (a numpy integer would not survive a JSON record), or a one-line UserError naming it."""
    for field, r in declared_counts(type(settings)).items():
        value = getattr(settings, field)
        is_integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if r.sentinel is not None and is_integer and value == r.sentinel:
            value = int(value)
        else:
            words = f"{r.sentinel} ({r.meaning})" if r.sentinel is not None else ""
            value = integer(r.name, value, r.minimum, r.maximum, words)
        object.__setattr__(settings, field, value)


def linf_radius(name: str, value, units: str = "L-inf radii are in [0, 1]") -> None:
    """An L-inf radius or step, or a radius of a per-pixel PR law, in the units of images in
    [0, 1]: above 1 it is the whole cube, and is almost surely one written in pixel levels (8
    meaning 8/255); refused with that reading. `value` may be a list of radii (PR's), each checked."""
    values = list(value) if isinstance(value, (tuple, list)) else [value]
    wrong = [v for v in values if v > 1]
    if wrong:
        given = ",".join(f"{v:g}" for v in values)
        meant = ", ".join(f"{v:g}/255 = {v / 255:.4f}" for v in wrong)
        head = f"{name}={given} > 1" if wrong == values else f"{name}={given}: {','.join(f'{v:g}' for v in wrong)} > 1"
        raise UserError(f"{head}: did you mean {meant}? ({units})")


# Below this an L2 attack radius is almost surely an L-inf one (8/255 = 0.031) given to the L2
# ball, whose standard radius on CIFAR-10 is 0.5: an attack 16 times weaker, whose robust accuracy
# reads as clean accuracy. Still a legal radius, so it is said, not refused.
SMALL_L2_RADIUS = 0.05
_SAID: set = set()


def small_l2_radius(name: str, value: float, standard: float) -> None:
    """Says in one line on stderr, once per process and setting, that an L2 attack radius below
    SMALL_L2_RADIUS looks like an L-inf one; the evaluation or training still runs."""
    if 0 < value < SMALL_L2_RADIUS and (name, value) not in _SAID:
        _SAID.add((name, value))
        print(
            f"warning: L2 attack radius {name}={value:.4g} (= {value * 255:.3g}/255) is below {SMALL_L2_RADIUS:g}, "
            f"the size of an L-inf radius; L2's standard radius on CIFAR-10 is {standard:g} (run as given)",
            file=sys.stderr,
            flush=True,
        )


def fraction(text) -> float:
    """A number as a command line gives it: a float (0.031) or a fraction of two (8/255), the way
    L-inf radii are written; a one-line UserError otherwise."""
    if not isinstance(text, str):
        return float(text)
    top, slash, bottom = text.partition("/")
    try:
        value = float(top) / float(bottom) if slash else float(text)
    except (ValueError, ZeroDivisionError):
        raise UserError(f"expected a number or a fraction such as 8/255, got {text!r}") from None
    return value


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
