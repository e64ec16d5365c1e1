"""The command lines' shared glue (`patjax.core.cli`)."""

import math
import time

import pytest

from patjax.core import cli
from patjax.core.errors import UserError


def test_max_minutes_is_a_wall_clock_time_that_far_from_now():
    assert cli.stop_time(None) is None
    before = time.time()
    stop = cli.stop_time(1.5)
    assert before + 90 <= stop <= time.time() + 90


@pytest.mark.parametrize("minutes", [0.0, -1.0, math.inf, math.nan])
def test_max_minutes_that_give_no_time_or_no_limit_are_refused_in_one_line(minutes):
    with pytest.raises(UserError) as error:
        cli.stop_time(minutes)
    assert str(error.value) == f"--max_minutes must be a positive number of minutes, got {minutes}"
