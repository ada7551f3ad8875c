"""Procedural arenas: seeded arena records generated from ``domains.yaml`` (the Table 2
miniature's training and held-out splits), beside the hand-written arena set in ``data/``."""

from eval.arenas.procedural.generator import MANIFEST, SPLITS, GenSpec, load_domains, write_arenas

__all__ = ["MANIFEST", "SPLITS", "GenSpec", "load_domains", "write_arenas"]
