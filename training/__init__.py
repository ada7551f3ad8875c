"""Data pipelines and SFT / RLVR recipes (verl at scale, TRL on one machine)."""
