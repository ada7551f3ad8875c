"""Test doubles for synthesis: a scripted teacher that answers every prompt template by rule.

:class:`ScriptedTeacher` is a script for :class:`~astra_agent.testing.ScriptedServer` (a fake
model over real HTTP). Its rules live in this package, one module per part of the pipeline,
each registered by template name (:mod:`training.testing.rules`); importing the package
registers them all. None of it is imported by a stage.

    python -m astra_agent.testing.scripted_server --port 8013 \\
        --script training.testing:script
"""

from training.testing import code, decompose, tools  # noqa: F401  (they register rules)
from training.testing.rules import ScriptedPlants
from training.testing.teacher import (
    OutputKind,
    Plant,
    ScriptedTeacher,
    script,
    scripted_teacher_server,
)

__all__ = [
    "OutputKind",
    "Plant",
    "ScriptedPlants",
    "ScriptedTeacher",
    "script",
    "scripted_teacher_server",
]
