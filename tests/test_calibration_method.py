"""The calibration tests' extrapolation (tests/calibration_support.py), on counts worked
out by hand: exact powers of two, and a·s^e + b within a noise for random data."""

import re

import calibration_support as calibration
import pytest

pytestmark = pytest.mark.cpu("arithmetic only")


def test_an_exact_power_of_two_or_nothing():
    assert calibration.power(10, 20, "x") == 1 and calibration.power(3, 48, "x") == 4
    assert calibration.power(7, 7, "x") == 0 and calibration.power(0, 0, "x") == 0
    for base, grown in ((10, 21), (10, 5), (0, 1)):
        with pytest.raises(calibration.NotExtrapolable):
            calibration.power(base, grown, "x")


def test_a_fit_within_noise_extrapolates_a_monomial_plus_a_constant():
    within = calibration.affine_within
    assert within((10, 20, 40), 1024, 0.05, "x") == 10 * 1024  # a·s
    assert within((1, 4, 16), 8, 0.05, "x") == 64  # a·s²
    assert within((103, 106, 112), 1000, 0.05, "x") == 3 * 1000 + 100  # runs: 3n + k
    assert within((5, 5, 5), 1 << 20, 0.05, "x") == 5  # it does not grow: a constant
    # Random counts: increments 1010 and 1990 are 2x within 1.5%, so the fit goes on.
    assert within((1000, 2010, 4000), 16, 0.05, "x") == pytest.approx(4000 + 995 * 12)


@pytest.mark.parametrize(("counts", "shape"), [
    ((65536, 256000, 524288), "does not grow as a·s^e + b"),  # waves of programs: 3x, then 1.4x
    ((95232, 112128, 129024), "grows as log(s)"),  # equal increments
    ((121, 126, 127), "does not grow as a·s^e + b"),  # a count that saturates
    ((24, 24, 32), "does not grow as a·s^e + b"),  # nothing, then something
])
def test_a_count_of_another_shape_is_refused(counts, shape):
    with pytest.raises(calibration.NotExtrapolable, match=re.escape(shape)):
        calibration.affine_within(counts, 1024, 0.05, "a count")
