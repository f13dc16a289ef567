"""The property tests are repeatable: the same examples on every run, nothing saved between runs."""

from hypothesis import settings

from tests.test_fuzz_tools import FUZZ


def test_every_property_test_draws_the_same_examples_and_keeps_no_database():
    for chosen in (settings.default, FUZZ, settings(max_examples=300, deadline=None)):  # the last as test_expr's
        assert chosen.derandomize is True and chosen.database is None
