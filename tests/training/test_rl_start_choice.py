"""Where the RL proofs start (``e2e.pick_start``): the SFT run differs from machine to machine,
so the start is found by probing its checkpoints, and the rule must find one on a run that
learns late as on one that learns early. Probes are written by hand here; the integration
suite probes real checkpoints."""

from __future__ import annotations

import pytest

from tests.training.e2e import TaskProbe, choose, pick_start


def solved(task: str, sampled: float) -> TaskProbe:
    return TaskProbe(task, 1.0, True, (sampled, 0.0))


def partly(task: str, greedy: float, sampled: float) -> TaskProbe:
    return TaskProbe(task, greedy, False, (sampled, 0.0))


def unrewarded(task: str) -> TaskProbe:
    return TaskProbe(task, 0.0, False, ())


# What a CI machine's run looked like at checkpoint 500 (one solved task, sampled once in 8;
# partly solved tasks never rewarded when sampled), and what a faster run's next checkpoint
# looks like.
EARLY = [solved("files-01", 0.08), partly("banking-02", 0.29, 0.0), unrewarded("weather-01")]
READY = [solved("weather-04", 0.06), solved("weather-03", 0.32), solved("files-01", 1.0),
         partly("banking-02", 0.5, 0.4)]  # fmt: skip


def test_the_first_checkpoint_with_two_solved_candidates_is_the_start() -> None:
    step, probes = pick_start([(400, EARLY), (500, EARLY), (600, READY), (700, READY)])
    assert step == 600 and probes is READY
    # the most room first: the lowest sampled mean; a task always solved is no candidate
    assert [p.task_id for p in choose(probes, 2)] == ["weather-04", "weather-03"]


def test_without_one_the_most_solved_choice_wins_the_earliest_on_a_tie() -> None:
    one = [solved("a", 0.2), partly("b", 0.4, 0.1), partly("c", 0.9, 0.1)]
    none = [partly("b", 0.9, 0.2), partly("c", 0.9, 0.1)]
    also_one = [solved("x", 0.5), partly("y", 0.2, 0.3)]
    assert pick_start([(400, none), (500, one), (600, also_one)])[0] == 500
    # one solved each: the higher greedy reward of the partly solved one that fills in
    assert pick_start([(400, also_one), (500, one)])[0] == 500
    assert pick_start([(400, one), (500, one)])[0] == 400


def test_no_checkpoint_with_enough_candidates_names_every_probe() -> None:
    with pytest.raises(AssertionError) as err:
        pick_start([(400, EARLY), (500, [unrewarded("x")])])
    text = str(err.value)
    assert "no checkpoint has 2 candidate tasks" in text
    assert "checkpoint-400: files-01 1.00*/0.04, banking-02 0.29/0.00" in text
    assert "checkpoint-500: \n" not in text and text.endswith("checkpoint-500: ")
