"""A relay node killed now and then is always restarted; one in a crash loop is given up on."""

import pytest
from cluster_util import Clock

from ipyparallel_broadcast.controller.restarts import RestartBudget

pytestmark = pytest.mark.pure


def test_a_node_killed_now_and_then_is_restarted_for_ever():
    clock = Clock()
    budget = RestartBudget(limit=10, window=60, clock=clock)
    for _ in range(100):  # a kill every 7 s, for over 11 minutes
        assert budget.allow()
        clock.now += 7


def test_a_crash_loop_is_given_up_on():
    clock = Clock()
    budget = RestartBudget(limit=3, window=60, clock=clock)
    assert [budget.allow() for _ in range(4)] == [True, True, True, False]
    clock.now += 61  # the window has moved past them
    assert budget.allow()
