"""The paper's Table 2 in miniature: procedural arenas (``arenagen``) and the base → SFT → RL
experiment on them (``experiment``)."""
