"""The ``astra-train`` CLI (SFT data synthesis, SFT and RLVR recipes land with their issues)."""

from astra_agent.console import placeholder_app

app = placeholder_app("astra-train", "synthesize SFT data, run SFT and multi-turn RLVR.")
