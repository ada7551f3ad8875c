"""Data synthesis, as ``astra-train synth`` runs it.

Tool-chain SFT data (``synth/tools``): ``pool`` → ``graph`` → ``confirm`` (the teacher checks
the graph's edges) → ``chains`` → ``check-chains`` (votes, back-translation) → ``tasks`` →
``interact`` → ``judge``. Verifiable RL environments (``synth/envs``): ``decompose`` →
``env-code`` → ``arenas``. What every stage shares (output directory, journal, resume,
provenance) is :mod:`training.synth.stage`; every stage that asks the teacher plugs into one
runner, :mod:`training.synth.runner` (a new one: copy ``synth/tools/judge.py``); the teacher
itself is :mod:`training.synth.teacher`. A scripted teacher for tests is
:mod:`training.testing`.
"""

from training.synth.stage import Provenance, Rejection, Shard, StageStats, SynthError

__all__ = ["Provenance", "Rejection", "Shard", "StageStats", "SynthError"]
