"""The ``astra-train`` CLI (SFT data synthesis, SFT and RLVR recipes land with their issues)."""

from astra_agent.console import placeholder_app
from astra_agent.options import common_callback

app = placeholder_app("astra-train", "synthesize SFT data, run SFT and multi-turn RLVR.")
common_callback(app, "astra-train")
