"""The general task families of the procedural arenas: function calling beyond id chains, over
the services of ``services.yaml`` (typed parameters, required and optional; tools answer with a
receipt computed from the normalised arguments, see :mod:`runtime`).

``typed``     one call; the request gives every required argument, in its own words (dates,
              times, numbers in words, lists, objects), and no optional one (defaults hold);
``optional``  one call; the request also sets one or two optional parameters;
``choose``    one call, offered beside every other function of its service (near names and
              descriptions) and one or two of other services;
``parallel``  one function called 2-4 times with different arguments (the gold answer is the
              tool's batch code: every call right, none extra);
``multi``     two or three functions of one service, each called once, in one request;
``none``      a request that no offered function can serve: the right answer is no call (an
              empty ``sub_qa_dict``: reward 1.0 with no call, 0.0 with any);
``followup``  two user turns: the first leaves out a required argument and the assistant asks
              for it, or the assistant reads the request back and the user changes one value;
              the call must use what the last turn says.

Each family has several wordings (openings, sentence frames, argument order, value formats).
A *plan* is a family, a service and the functions it needs; its signature splits the plans
between training and split b as the chain signatures are, and the hash of a task's calls
splits its values between training and split a.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from typing import Any

from eval.arenas.procedural.arguments import draw, key, other, phrase, write
from eval.arenas.procedural.catalog import Catalog, Function, Param, Service
from eval.arenas.procedural.runtime import batch, canonical, receipt

GENERAL = ("typed", "optional", "choose", "parallel", "multi", "none", "followup")
_INSTANCE_SALT = "astra-general-instance-v1"

_OPEN = ("", "", "", "Hi! ", "Hello. ", "Quick one: ", "Hey! ")
_CLOSE = ("", "", "", " Thanks!", " Thank you.", " Cheers.")
_FRAMES = (
    "{Ask} {rest}.",
    "Please {ask} {rest}.",
    "Could you {ask} {rest}?",
    "I'd like you to {ask} {rest}.",
    "Can you {ask} {rest}, please?",
    "I need you to {ask} {rest}.",
)
_LIST_INTROS = (
    "I have {k} requests.",
    "Please take care of these {k} things.",
    "Do all {k} of these for me.",
    "{K} jobs for you:",
)
_THEN = ("Also, {ask} {rest}.", "Then {ask} {rest}.", "After that, {ask} {rest}.")
_ASK_MISSING = (
    "Sure. Could you give me the {doc}?",
    "Happy to help. I still need the {doc}.",
    "Before I go ahead, please tell me the {doc}.",
)
_GIVE_MISSING = ("{Doc}: {v}.", "Use {v} for the {doc}.", "Sorry, the {doc}: {v}.")
_READ_BACK = (
    "Just to confirm: I will {ask} {rest}. Shall I go ahead?",
    "Got it: {ask} {rest}. Is that right?",
)
_CHANGE = (
    "Yes, but make the {doc} {v} instead.",
    "Almost: change the {doc} to {v}, then go ahead.",
    "Please use {v} as the {doc} instead; the rest is right.",
)
_COUNT = ("", "", "two", "three", "four")


@dataclass(frozen=True)
class FamilyPlan:
    """A family's task shape in one service: the functions it calls (``none``: the one it
    asks for, which is not offered)."""

    family: str
    service: str
    functions: tuple[str, ...]

    @property
    def signature(self) -> str:
        return f"{self.service}:{self.family}:{'+'.join(self.functions)}"


def family_plans(family: str, service: Service) -> list[FamilyPlan]:
    """Every plan of ``family`` in ``service``."""
    fns = service.functions
    names: list[tuple[str, ...]]
    if family == "optional":
        names = [(f.name,) for f in fns if f.optional]
    elif family == "followup":
        names = [(f.name,) for f in fns if len(_askable(f.required[1:])) >= 1]
    elif family == "multi":
        names = [tuple(f.name for f in c) for k in (2, 3) for c in itertools.combinations(fns, k)]
    else:
        names = [(f.name,) for f in fns]
    return [FamilyPlan(family, service.name, n) for n in names]


def _askable(params: list[Param]) -> list[Param]:
    return [p for p in params if p.type != "bool"]


@dataclass(frozen=True)
class Draft:
    """A task of a general family before it becomes a record."""

    plan: FamilyPlan
    messages: list[dict[str, str]]
    offered: list[str]
    calls: list[tuple[str, dict[str, Any]]]  # the reference, in order
    asked: tuple[str, dict[str, Any]] | None = None  # ``none``: the call nobody can make

    def sub_qa(self, catalog: Catalog) -> dict[str, list[str]]:
        """Each called tool's gold answer: its receipt, or its batch code when it is called
        more than once."""
        keys: dict[str, list[str]] = {}
        for name, args in self.calls:
            keys.setdefault(name, []).append(canonical(catalog.function(name).runtime_spec(), args))
        return {
            n: [receipt(f"{n}|{ks[0]}") if len(ks) == 1 else batch(n, ks)] for n, ks in keys.items()
        }

    def instance(self, catalog: Catalog) -> str:
        """A hash of what the task asks for (its calls' normalised arguments)."""
        calls = self.calls or ([self.asked] if self.asked else [])
        text = "|".join(
            sorted(f"{n}:{canonical(catalog.function(n).runtime_spec(), a)}" for n, a in calls)
        )
        return hashlib.sha256(f"{_INSTANCE_SALT}|{text}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Writer:
    """Draws arguments and writes requests for one task."""

    catalog: Catalog
    rng: random.Random

    def args(self, fn: Function, n_optional: int = 0) -> dict[str, Any]:
        """Every required argument, and ``n_optional`` optional ones set to a value other
        than their default."""
        out = {p.name: draw(p, self.catalog, self.rng) for p in fn.required}
        chosen = self.rng.sample(fn.optional, min(n_optional, len(fn.optional)))
        for p in sorted(chosen, key=fn.params.index):
            out[p.name] = other(p, p.default, self.catalog, self.rng)
        return out

    def maybe_optional(self, fn: Function, share: float) -> dict[str, Any]:
        return self.args(fn, 1 if self.rng.random() < share else 0)

    def clause(self, fn: Function, args: dict[str, Any], skip: str | None = None) -> str:
        """``reserve a room for Ada Novak, arriving March 5, 2026, for 3 nights``: the lead
        parameter first, the others in a random order."""
        params = [p for p in fn.params if p.name in args and p.name != skip]
        lead, rest = params[:1], params[1:]
        self.rng.shuffle(rest)
        parts = [phrase(p, args[p.name], self.rng) for p in [*lead, *rest]]
        joint = self.rng.choice((", ", " "))
        return f"{self.rng.choice(fn.ask)} {joint.join(parts)}"

    def frame(self, clause: str, *, close: bool = True) -> str:
        ask, rest = clause.split(" ", 1)
        text = self.rng.choice(_FRAMES).format(ask=ask, Ask=ask.capitalize(), rest=rest)
        return self.rng.choice(_OPEN) + text + (self.rng.choice(_CLOSE) if close else "")

    def listed(self, clauses: list[str]) -> str:
        k = len(clauses)
        intro = self.rng.choice(_LIST_INTROS).format(k=_COUNT[k], K=_COUNT[k].capitalize())
        items = " ".join(f"{i}. {c[0].upper()}{c[1:]}." for i, c in enumerate(clauses, 1))
        return self.rng.choice(_OPEN) + f"{intro} {items}" + self.rng.choice(_CLOSE)

    def chained(self, clauses: list[str]) -> str:
        first = self.frame(clauses[0], close=False)
        then = [
            self.rng.choice(_THEN).format(ask=c.split(" ", 1)[0], rest=c.split(" ", 1)[1])
            for c in clauses[1:]
        ]
        return " ".join([first, *then]) + self.rng.choice(_CLOSE)

    def others(self, services: list[Service], exclude: str, n: int) -> list[str]:
        """``n`` functions of services other than ``exclude``."""
        pool = sorted(f.name for s in services if s.name != exclude for f in s.functions)
        return self.rng.sample(pool, min(n, len(pool)))


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _typed(w: Writer, plan: FamilyPlan, services: list[Service]) -> Draft:
    fn = w.catalog.function(plan.functions[0])
    n_opt = w.rng.randint(1, 2) if plan.family == "optional" else 0
    args = w.args(fn, n_opt) if plan.family != "choose" else w.maybe_optional(fn, 0.3)
    if plan.family == "choose":
        siblings = [f.name for f in w.catalog.service_of(fn.name).functions]
        offered = siblings + w.others(services, plan.service, w.rng.randint(1, 2))
    else:
        offered = [fn.name, *w.others(services, plan.service, w.rng.randint(0, 2))]
    return Draft(plan, _user(w.frame(w.clause(fn, args))), offered, [(fn.name, args)])


def _parallel(w: Writer, plan: FamilyPlan, services: list[Service]) -> Draft | None:
    fn = w.catalog.function(plan.functions[0])
    k = w.rng.choice((2, 2, 3, 3, 4))
    vary = _askable(fn.required)
    if w.rng.random() < 0.5 and vary:  # one value varies: "..., once for A and once for B"
        p = w.rng.choice(vary)
        base = w.args(fn)
        values = [base[p.name]]
        for _ in range(50):
            if len(values) == k:
                break
            new = other(p, values[-1], w.catalog, w.rng)
            if key(p, new) not in {key(p, v) for v in values}:
                values.append(new)
        calls = [(fn.name, {**base, p.name: v}) for v in values]
        once = [f"once {phrase(p, v, w.rng)}" for v in values]
        text = w.clause(fn, base, skip=p.name) + ", " + ", ".join(once[:-1]) + " and " + once[-1]
        text = w.frame(text)
    else:
        calls = [(fn.name, w.args(fn)) for _ in range(k)]
        text = w.listed([w.clause(fn, a) for _, a in calls])
    spec = fn.runtime_spec()
    if len(calls) < 2 or len({canonical(spec, a) for _, a in calls}) < len(calls):
        return None
    offered = [fn.name, *w.others(services, plan.service, w.rng.randint(0, 2))]
    return Draft(plan, _user(text), offered, calls)


def _multi(w: Writer, plan: FamilyPlan, services: list[Service]) -> Draft:
    fns = [w.catalog.function(n) for n in plan.functions]
    w.rng.shuffle(fns)
    calls = [(f.name, w.maybe_optional(f, 0.25)) for f in fns]
    clauses = [w.clause(f, a) for f, (_, a) in zip(fns, calls, strict=True)]
    text = w.listed(clauses) if w.rng.random() < 0.5 else w.chained(clauses)
    offered = [*plan.functions, *w.others(services, plan.service, w.rng.randint(0, 2))]
    return Draft(plan, _user(text), offered, calls)


def _none(w: Writer, plan: FamilyPlan, services: list[Service]) -> Draft:
    fn = w.catalog.function(plan.functions[0])
    args = w.maybe_optional(fn, 0.3)
    offered = w.others(services, plan.service, w.rng.randint(2, 4))
    return Draft(plan, _user(w.frame(w.clause(fn, args))), offered, [], (fn.name, args))


def _followup(w: Writer, plan: FamilyPlan, services: list[Service]) -> Draft:
    fn = w.catalog.function(plan.functions[0])
    args = w.maybe_optional(fn, 0.3)
    if w.rng.random() < 0.5:  # a required value left out, asked for, given
        p = w.rng.choice(_askable(fn.required[1:]))
        first = w.frame(w.clause(fn, args, skip=p.name))
        reply = w.rng.choice(_ASK_MISSING).format(doc=p.doc)
        value = write(p, args[p.name], w.rng)
        last = w.rng.choice(_GIVE_MISSING).format(doc=p.doc, Doc=p.doc.capitalize(), v=value)
    else:  # the request read back, one value changed
        p = w.rng.choice(_askable([q for q in fn.params if q.name in args]))
        said = w.clause(fn, args)
        first = w.frame(said)
        ask, rest = said.split(" ", 1)
        reply = w.rng.choice(_READ_BACK).format(ask=ask, rest=rest)
        args = {**args, p.name: other(p, args[p.name], w.catalog, w.rng)}
        last = w.rng.choice(_CHANGE).format(doc=p.doc, v=write(p, args[p.name], w.rng))
    messages = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": last},
    ]
    offered = [fn.name, *w.others(services, plan.service, w.rng.randint(0, 2))]
    return Draft(plan, messages, offered, [(fn.name, args)])


_BUILDERS = {
    "typed": _typed,
    "optional": _typed,
    "choose": _typed,
    "parallel": _parallel,
    "multi": _multi,
    "none": _none,
    "followup": _followup,
}


def make_draft(
    plan: FamilyPlan, catalog: Catalog, services: list[Service], rng: random.Random
) -> Draft | None:
    """A task of ``plan`` (None: this draw failed, draw again); ``services`` are where its
    other offered functions come from (the split's services)."""
    return _BUILDERS[plan.family](Writer(catalog, rng), plan, services)


TOGETHER = ("parallel", "multi")  # families whose reference calls are made in one reply


def draft_record(draft: Draft, catalog: Catalog) -> dict[str, Any]:
    """The record's task fields (the generator adds ids, split and domain)."""
    offered = sorted(set(draft.offered))
    fns = [catalog.function(n) for n in offered]
    # a parallel or multi task's calls are independent: one reply makes them all, as a model
    # is asked to (BFCL's parallel categories, an OpenAI reply's tool_calls list)
    step = {"step": 1} if draft.plan.family in TOGETHER else {}
    return {
        "prompt": draft.messages,
        "tool_schema": json.dumps([f.openai_schema() for f in fns]),
        "tool_dict": json.dumps({f.name: f.source() for f in fns}),
        "sub_qa_dict": json.dumps(draft.sub_qa(catalog)),
        "reference": [{"name": n, "arguments": a, **step} for n, a in draft.calls],
    }
