"""The ``astra-eval`` CLI (BFCL-V3 multi-turn and arena evaluation land with their issues)."""

from astra_agent.console import placeholder_app

app = placeholder_app("astra-eval", "score BFCL-V3 multi-turn and the RL arenas.")
