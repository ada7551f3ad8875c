"""General ability (not tool use): lm-eval generation tasks against an OpenAI-compatible chat
endpoint, the model's thinking handled, results in the eval run-dir layout."""

from eval.general.runner import (
    PUBLISHED,
    GeneralEvalConfig,
    GeneralRecord,
    evaluate_general,
    require_lm_eval,
)
from eval.general.tasks import TASKS_DIR
from eval.general.thinking import answer_after_think

__all__ = [
    "PUBLISHED",
    "TASKS_DIR",
    "GeneralEvalConfig",
    "GeneralRecord",
    "answer_after_think",
    "evaluate_general",
    "require_lm_eval",
]
