"""The general families (:mod:`families`) split as the chains are: training and split a draw
from the training services' plans whose signature is not held out, split a only task values
(the hash of the calls) that training never gets; split b the held-out signatures of the
training services; split c the held-out services (none of their function-name words in any
training function)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from astra_agent.errors import ConfigError
from eval.arenas.procedural.catalog import Catalog, Service, load_catalog, split_services
from eval.arenas.procedural.families import (
    Draft,
    FamilyPlan,
    draft_record,
    family_plans,
    make_draft,
)


@dataclass(frozen=True)
class ServicePool:
    """Where one split draws its general tasks: the services (the other offered functions
    come from them too), the plans, and the parity of the task hash it keeps (None: any)."""

    services: list[Service]
    plans: list[FamilyPlan]
    parity: int | None

    def families(self) -> list[str]:
        """The families with a plan here, in the order asked."""
        return list(dict.fromkeys(p.family for p in self.plans))


def service_pools(
    catalog: Catalog,
    families: list[str],
    words: tuple[set[str], set[str]],
    heldout: Callable[[str], bool],
) -> dict[str, ServicePool]:
    """Each split's pool; ``words`` are the chain domains' training and held-out words,
    ``heldout`` says whether a signature is held out of training."""
    train, held = split_services(catalog, *words)
    plans = [p for f in families for s in train for p in family_plans(f, s)]
    kept = [p for p in plans if not heldout(p.signature)]
    out = [p for p in plans if heldout(p.signature)]
    unseen = [p for f in families for s in held for p in family_plans(f, s)]
    if not kept or not out:
        raise ConfigError("the signature holdout leaves training or split b without general tasks")
    return {
        "train": ServicePool(train, kept, 0),
        "a": ServicePool(train, kept, 1),
        "b": ServicePool(train, out, None),
        "c": ServicePool(held, unseen, None),
    }


@dataclass(frozen=True)
class GeneralTasks:
    """The general families' side of a generation: the catalogue, each split's pool, and the
    user turns and task keys made so far (every split: no prompt twice anywhere)."""

    catalog: Catalog
    pools: dict[str, ServicePool]
    taken: set[str]

    @classmethod
    def of(
        cls, families: list[str], words: tuple[set[str], set[str]], heldout: Callable[[str], bool]
    ) -> GeneralTasks:
        catalog = load_catalog()
        return cls(catalog, service_pools(catalog, families, words, heldout), set())

    def record(self, split: str, n: int, family: str, rng: random.Random) -> dict[str, Any] | None:
        return general_record(split, n, family, self.pools[split], self.catalog, rng, self.taken)


def general_record(
    split: str,
    n: int,
    family: str,
    pool: ServicePool,
    catalog: Catalog,
    rng: random.Random,
    taken: set[str],
) -> dict[str, Any] | None:
    """A record of ``family`` for ``split``. Draws that are not kept (values of the other of
    training and split a, a prompt or task already made: ``taken``) are drawn again, so that
    every family keeps its share; None after 20 misses."""
    for _ in range(20):
        plan = rng.choice([p for p in pool.plans if p.family == family])
        draft = make_draft(plan, catalog, pool.services, rng)
        if draft is None:
            continue
        instance = draft.instance(catalog)
        if pool.parity is not None and int(instance, 16) % 2 != pool.parity:
            continue
        texts = {f"text|{m['content']}" for m in draft.messages if m["role"] == "user"}
        task_key = f"task|{plan.signature}|{instance}"
        if task_key in taken or texts & taken:
            continue
        taken.update(texts | {task_key})
        return _record(split, n, draft, catalog, instance)
    return None


def _record(split: str, n: int, draft: Draft, catalog: Catalog, instance: str) -> dict[str, Any]:
    fields = draft_record(draft, catalog)
    return {
        "prompt": fields["prompt"],
        "tool_schema": fields["tool_schema"],
        "tool_dict": fields["tool_dict"],
        "sub_qa_dict": fields["sub_qa_dict"],
        "task_id": f"{split}-{draft.plan.service}-{n:04d}",
        "domain": draft.plan.service,
        "reference": fields["reference"],
        "split": split,
        "kind": draft.plan.family,
        "signature": draft.plan.signature,
        "instance": instance,
    }
