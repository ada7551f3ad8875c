"""Procedural arenas: seeded arena records generated from ``domains.yaml`` (id chains) and,
when asked, ``services.yaml`` (general function calling), for the Table 2 miniature's training
and held-out splits, beside the hand-written arena set in ``data/``."""

from eval.arenas.procedural.generator import (
    FAMILIES,
    MANIFEST,
    SPLITS,
    GenSpec,
    load_domains,
    write_arenas,
)

__all__ = ["FAMILIES", "MANIFEST", "SPLITS", "GenSpec", "load_domains", "write_arenas"]
