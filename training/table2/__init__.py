"""The paper's Table 2 in miniature: the base → SFT → RL experiment on the procedural arenas
(:mod:`eval.arenas.procedural`): its config (``config``), its directory (``directory``), its
stages (``experiment``) and its table (``table``); ``astra-train table2`` (``cli``)."""
