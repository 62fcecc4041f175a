"""A mix's weights are read as the numbers written: a float as its shortest decimal (0.7 is 7/10, as
"0.7" on the command line), so 0.7/0.3 and 7/3 count alike; huge weights neither overflow nor lose
their shares; a state saved mid-epoch by a datapipe that read the binary float is refused in one line
that says why, and resumes at the next boundary."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from datapipe.mix.sources import exact_weight
from tests.test_mix_order import make_mix, order

SEVEN = {"big": 0.7, "web": 0.3, "small": 0}


@pytest.mark.parametrize("weight, exact", [(0.7, Fraction(7, 10)), (np.float32(0.7), Fraction(7, 10)),
                                           (np.float64(0.1), Fraction(1, 10)), (3, Fraction(3)),
                                           (np.int64(3), Fraction(3)), (Fraction(1, 3), Fraction(1, 3)),
                                           (1e308, Fraction(10) ** 308), (5e-324, Fraction(5, 10**324))])
def test_a_weight_is_the_number_written(weight, exact):
    assert exact_weight(weight) == exact


def test_decimal_weights_and_their_integer_multiples_count_alike():
    """0.7 x 35 = 24.4999... as a binary float: 24/11 before, 25/10 (7 x 35 / 10 = 24.5, ties to the earlier)."""
    integers = make_mix({"big": 7, "web": 3, "small": 0}, epoch_size=35)
    assert make_mix(SEVEN, epoch_size=35).counts(0) == integers.counts(0) == (25, 10, 0)


def test_shares_of_huge_weights_are_exact():
    mix = make_mix({"big": 1e308, "web": 1e308, "small": 5e-324}, epoch_size=60)
    assert [row["weight"] for row in mix.table()] == [0.5, 0.5, 0.0] and mix.counts(0) == (30, 30, 0)


def test_a_mid_epoch_state_of_the_binary_rule_is_refused_saying_why_and_a_boundary_resumes():
    mix = make_mix(SEVEN, epoch_size=35)
    o = order(mix)
    old = {"epoch": 0, **o.save(8, 0)}
    old["mix"]["counts"] = [24, 11, 0]  # what the binary float's 0.7 gave
    del old["mix"]["weights_read"]
    with pytest.raises(ValueError, match=r"^cannot resume mid-epoch: the state was saved with other per-source counts "
                                         r"\(weights\) \(\[24, 11, 0\], this mix has \[25, 10, 0\]\) \(this datapipe "
                                         r"reads a float weight as the decimal it is written as, 0\.7 as 7/10") as err:
        order(mix).restore(old)
    assert "\n" not in str(err.value)
    boundary = {"epoch": 1, **o.save(0, 1)}
    del boundary["mix"]["weights_read"]
    assert order(mix).restore(boundary) == 0
