"""A τ² conversation to play (:class:`Item`) and its record (:class:`Tau2Record`): what the
run (:mod:`eval.tau2.runner`), the inspect_ai adapter that plays and records the conversations
(:mod:`eval.tau2.adapter`) and the readers of τ² runs share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.trajectory import Trajectory
from eval.results import EvalRecord
from eval.summaries import EvalSummary

Domain = Literal["retail", "telecom", "airline"]


class Tau2Record(EvalRecord):
    """One conversation: ``id`` is ``domain/task_id/trial``; ``reward`` 1.0 when every check
    of the task passed, ``None`` when the conversation could not be played (an error)."""

    domain: str
    task_id: str
    trial: int
    reward: float | None = None
    explanation: str = ""
    turns: int = 0  # user-simulator messages
    tool_calls: int = 0  # the agent's
    user_tool_calls: int = 0
    # "stop", "transfer", "out_of_scope", "message_limit", "max_steps", "error"
    termination: str = ""
    usage: dict[str, dict[str, int]] = Field(default_factory=dict)
    trajectory: Trajectory | None = None  # the agent's side: policy, user turns, calls, results
    user_side: list[dict[str, Any]] = Field(default_factory=list)  # the simulator's messages


class Tau2Domain(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    tasks: int | None = None
    conversations: int | None = None
    scored: int | None = None
    errors: int | None = None
    mean_reward: float | None = None
    pass_hat_k: dict[str, float] = Field(default_factory=dict)  # "1".."trials"
    tasks_with_all_trials: int | None = None


class Tau2Summary(EvalSummary):
    conversations: int | None = None
    errors: int | None = None
    trials: int | None = None
    overall_pass_1: float | None = None
    domains: dict[str, Tau2Domain] = Field(default_factory=dict)
    data: dict[str, str] = Field(default_factory=dict)  # τ²'s data version (eval.tau2)
    user_simulator: dict[str, Any] = Field(default_factory=dict)  # its model and sampling


@dataclass(frozen=True)
class Item:
    domain: Domain
    task_id: str
    trial: int

    @property
    def id(self) -> str:
        return f"{self.domain}/{self.task_id}/{self.trial}"


def error_record(item: Item, error: str) -> Tau2Record:
    """A conversation that could not be played or scored (``run`` error: not scored)."""
    return Tau2Record(
        id=item.id, domain=item.domain, task_id=item.task_id, trial=item.trial,
        termination="error", error_kind="run", error=error,
    )  # fmt: skip
