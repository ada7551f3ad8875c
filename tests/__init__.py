"""The test suite. Set here, before anything imports torch (pytest imports this package before
its conftest.py), so that this process and every child it starts inherit it:

``OMP_WAIT_POLICY=PASSIVE``: the suite runs two pytest-xdist workers on two cores, and each
trains, serves or rolls out with torch's OpenMP threads (one per core). GNU OpenMP's default
spins a waiting thread on its core, so two such processes take each other's cores: measured on
a Xeon capped to AVX2 (docs/testing.md), the real model's SFT beside the tiny model's ran at
40 tokens/s (170 alone) and the tiny SFT at 1.1 steps/s (5.3 alone); with PASSIVE, 97 tokens/s
and 2.9 steps/s, for 7-15 % less speed when a process runs alone. A value already set wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
