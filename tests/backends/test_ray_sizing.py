"""pool_workers="auto"'s policy (datapipe.backends.ray.autoscale) on synthetic wait series, its clock
injected: grows while the trainer waits, holds in between, shrinks after fed windows only where the
actors left carry the load, never under 1; and how many actors a cluster's nodes hold."""
from __future__ import annotations

from datapipe.backends.ray.autoscale import Sizing, Window
from datapipe.pool_sizing import capacity


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def series(sizing: Sizing, clock: Clock, waits: list[float], away: float, busy: float = 0.0) -> list[Window | None]:
    """Each batch: the trainer away `away` s, then waits `wait` s for it; the windows that closed."""
    out = []
    for wait in waits:
        clock.t += away
        asked = clock()
        clock.t += wait
        out.append(sizing.received(asked, busy))
    return [w for w in out if w is not None]


def sized(waits: list[float], away: float = 1.0, busy: float = 0.0, size: int = 2, **kw) -> list[int]:
    """The pool size after each window of `waits` (each window's wanted size applied)."""
    clock = Clock()
    sizing = Sizing(window=4, clock=clock, **kw)
    sizes = []
    for window in series(sizing, clock, waits, away, busy):
        size = sizing.wanted(window, size)
        sizes.append(size)
    return sizes


def test_the_first_window_of_an_iteration_is_not_looked_at():
    clock = Clock()
    sizing = Sizing(window=4, clock=clock)
    assert series(sizing, clock, [1.0] * 4, away=0.0) == []
    assert series(sizing, clock, [1.0] * 4, away=0.0) == [Window(1.0, 0.0)]
    sizing.restart()
    assert series(sizing, clock, [1.0] * 4, away=0.0) == []


def test_the_wait_fraction_and_load_of_a_window():
    clock = Clock()
    sizing = Sizing(window=4, clock=clock)
    (window,) = series(sizing, clock, [0.5] * 8, away=1.5, busy=3.0)
    assert window.wait == 0.25 and window.load == 1.5  # 4 x 0.5 of 4 x 2 s; 4 x 3 actor-s over 8 s


def test_a_starved_trainer_grows_the_pool_every_window():
    assert sized([0.5] * 16, away=1.0, size=1) == [2, 3, 4]


def test_a_wait_between_the_thresholds_holds_the_size():
    assert sized([0.05] * 24, away=1.0, size=3) == [3] * 5  # 4.8%: neither starved nor fed


def test_a_fed_trainer_shrinks_after_calm_windows_down_to_one():
    assert sized([0.0] * 36, away=1.0, size=3) == [3, 2, 2, 1, 1, 1, 1, 1]


def test_no_shrink_where_the_actors_left_could_not_carry_the_load():
    # 3 actors busy 2.0 of every 1.0 s: 2 actors would carry it, without 25% to spare
    assert sized([0.0] * 36, away=1.0, busy=2.0, size=3) == [3] * 8
    assert sized([0.0] * 36, away=1.0, busy=1.5, size=3) == [3, 2, 2, 2, 2, 2, 2, 2]


def test_a_starved_window_restarts_the_calm_count():
    waits = [0.0] * 8 + [0.5] * 4 + [0.0] * 8
    assert sized(waits, size=3) == [3, 4, 4, 3]


def test_capacity_counts_live_nodes_holding_every_resource():
    needs = {"CPU": 1.0, "datapipe": 1.0}
    nodes = [dict(Alive=True, Resources={"CPU": 4.0, "datapipe": 2.0}),
             dict(Alive=True, Resources={"CPU": 8.0}),
             dict(Alive=False, Resources={"CPU": 8.0, "datapipe": 8.0}),
             dict(Alive=True, Resources={"CPU": 1.0, "datapipe": 3.0})]
    assert capacity(nodes, needs) == 3
    assert capacity(nodes, {"CPU": 1.0}) == 13
    assert capacity([], needs) == 0
