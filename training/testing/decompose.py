"""The scripted teacher's rules for the ``decompose``, ``necessity`` and ``verify`` templates
(tests).

``decompose``
    a chain from a small table of question templates per domain family (logistics, finance,
    travel, health; a generic one for any other domain), picked by the question's index and
    filled with values drawn from a hash of the domain and index (``SKU-4417``, ``12.5 kg``):
    answerable chains whose final answer contains every last step's answer. For a seed, a
    two-step chain around the seed's question (and answer).
``necessity``
    no tool when the sub-answer is already in the main question, or the sub-question is
    arithmetic ("Compute …"); a tool otherwise.
``verify``
    dependency 5, atomicity 5 (2 when a sub-question asks two things: two question marks),
    forced serialization 4, completeness 5 (2 when the final answer misses a last step's
    answer).

Plants for tests: a ``plant:<kind>`` token in the domain's name or description bends the
rules — ``cycle``, ``unknown_dep``, ``dup_id``, ``dup_sub``, ``not_derived``, ``short`` (one
step), ``long`` (seven), ``unneeded`` (the first step's answer stated in the main question),
``ambiguous`` (a step asking two things), ``meh`` (verify scores 4, 4, 3, 4), ``bad_schema``
(a decomposition of the wrong shape) and ``necessity_schema`` (a verdict of the wrong type).
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from training.synth.envs.records import SubQuestion, contains_answer, sinks
from training.testing.rules import ScriptedPlants, json_line, last_line, rule

DOMAIN_LINE = re.compile(r"^Domain \(JSON\): (.*)$", re.MULTILINE)
SEED_LINE = re.compile(r"^Seed question \(JSON\): (.*)$", re.MULTILINE)
INDEX_LINE = re.compile(r"^Index: (\d+)$", re.MULTILINE)
QUESTION_LINE = re.compile(r"^Main question \(JSON string\): (.*)$", re.MULTILINE)
STEP_LINE = re.compile(r"^Sub-question \(JSON\): (.*)$", re.MULTILINE)
CHAIN_LINE = re.compile(r"^Decomposition \(JSON\): (.*)$", re.MULTILINE)
PLANT = re.compile(r"plant:([a-z_]+)")
COMPUTE = re.compile(r"^(compute|calculate|convert|add up|sum)\b", re.IGNORECASE)

Step = tuple[str, str, list[int]]  # question, answer, 1-based indices of the steps it needs
Template = tuple[str, str, list[Step]]  # main question, final answer, steps

FAMILIES: list[tuple[tuple[str, ...], list[Template]]] = [
    (("logistic", "shipping", "warehouse", "supply", "commerce"), [
        ("For order {order}, how much does its heaviest item weigh, and which warehouse stocks "
         "that item?", "{weight} kg, stocked at {warehouse}", [
            ("Which SKU is the heaviest item in order {order}?", "{sku}", []),
            ("How much does the heaviest item of order {order} weigh?", "{weight} kg", [1]),
            ("Which warehouse stocks the heaviest item of order {order}?", "{warehouse}", [1]),
        ]),
        ("Shipment {tracking} is late: which carrier has it, and when does that carrier's next "
         "pickup in {city} start?", "{carrier}, next pickup at {time}", [
            ("Which carrier is handling shipment {tracking}?", "{carrier}", []),
            ("When does the next pickup in {city} of the carrier handling shipment {tracking} "
             "start?", "{time}", [1]),
        ]),
    ]),
    (("financ", "bank", "account", "invest", "tax", "insurance"), [
        ("How much interest will account {account} earn in one year at the current rate of its "
         "savings product?", "EUR {interest}", [
            ("What is the current balance of account {account}?", "EUR {balance}", []),
            ("Which savings product is account {account} on?", "{product}", []),
            ("What is the current annual interest rate of the savings product of account "
             "{account}?", "{rate} %", [2]),
            ("Compute one year of interest on the balance of account {account} at that rate.",
             "EUR {interest}", [1, 3]),
        ]),
        ("What was the closing price of {ticker} on the day it paid its last dividend?",
         "USD {price} on {date}", [
            ("On which date did {ticker} pay its last dividend?", "{date}", []),
            ("What was the closing price of {ticker} on the date of its last dividend?",
             "USD {price}", [1]),
        ]),
    ]),
    (("travel", "flight", "hotel", "tourism", "transport"), [
        ("I am booked on flight {flight}: which gate does it leave from, and what is the "
         "forecast at its destination when it lands?", "Gate {gate}; {temp} °C, {sky}", [
            ("Which airport is flight {flight} flying to?", "{airport}", []),
            ("Which gate does flight {flight} depart from?", "Gate {gate}", []),
            ("What is the forecast at the destination airport of flight {flight} at its "
             "arrival time?", "{temp} °C, {sky}", [1]),
        ]),
        ("What does the cheapest hotel near the venue of {conference} cost per night?",
         "{hotel}, EUR {night} per night", [
            ("In which city is {conference} held?", "{city}", []),
            ("Which venue hosts {conference}?", "{venue}", []),
            ("Which hotel within 1 km of the venue of {conference} is the cheapest?", "{hotel}",
             [1, 2]),
            ("What is the nightly rate of the cheapest hotel near the venue of {conference}?",
             "EUR {night}", [3]),
        ]),
    ]),
    (("health", "medic", "clinic", "hospital", "pharma"), [
        ("Patient {patient} got a new prescription yesterday: does it interact with a drug they "
         "already take?", "Yes: {drug} interacts with {current}", [
            ("Which drug was prescribed to patient {patient} yesterday?", "{drug}", []),
            ("Which drugs is patient {patient} currently taking?", "{current}", []),
            ("Which of the current drugs of patient {patient} interacts with yesterday's "
             "prescription?", "{current}", [1, 2]),
        ]),
        ("At which clinic is the next appointment of patient {patient}, and when does that "
         "clinic open that day?", "{clinic}, opening at {time}", [
            ("On which date is the next appointment of patient {patient}?", "{date}", []),
            ("At which clinic is the next appointment of patient {patient}?", "{clinic}", []),
            ("When does the clinic of the next appointment of patient {patient} open on the "
             "day of that appointment?", "{time}", [1, 2]),
        ]),
    ]),
    ((), [  # any other domain
        ("In the {domain} records, who owns item {ref}, and what is that owner's contact "
         "email?", "{person}, {email}", [
            ("Who owns item {ref} in the {domain} records?", "{person}", []),
            ("What is the contact email of the owner of item {ref}?", "{email}", [1]),
        ]),
        ("When was item {ref} of the {domain} catalogue last updated, and by whom?",
         "{date}, by {person}", [
            ("When was item {ref} of the {domain} catalogue last updated?", "{date}", []),
            ("Who made the last update to item {ref} of the {domain} catalogue?", "{person}",
             []),
        ]),
    ]),
]  # fmt: skip

NAMES = ("Ana Ruiz", "Tomás Berg", "Mei Chen", "Kofi Mensah", "Lena Vogel", "Ravi Iyer")
CITIES = ("Leeds", "Lyon", "Porto", "Gdańsk", "Utrecht", "Bilbao")


def _values(domain: str, index: int) -> dict[str, str]:
    """Concrete values for the templates, drawn from a hash of the domain and index."""
    r = random.Random(hashlib.sha256(f"{domain}\n{index}".encode()).digest())
    balance, rate = r.randrange(1_000, 20_000, 50), r.choice((2.5, 3.0, 3.25, 4.0))
    person = r.choice(NAMES)
    return {
        "domain": domain,
        "order": f"ORD-{r.randint(10_000, 99_999)}",
        "sku": f"SKU-{r.randint(1000, 9999)}",
        "weight": f"{r.randint(2, 40)}.{r.choice('05')}",
        "warehouse": f"WH-{r.choice(CITIES)}-{r.randint(1, 9)}",
        "tracking": f"TRK-{r.randint(100_000, 999_999)}",
        "city": r.choice(CITIES),
        "carrier": r.choice(("NordFreight", "Atlas Parcel", "Veloce Cargo")),
        "time": f"{r.randint(7, 18):02d}:{r.choice(('00', '15', '30', '45'))}",
        "account": f"ACC-{r.randint(100_000, 999_999)}",
        "balance": f"{balance:,.2f}",
        "product": r.choice(("Flex Saver", "Goal Saver Plus", "Easy Access 2")),
        "rate": f"{rate:g}",
        "interest": f"{balance * rate / 100:,.2f}",
        "ticker": r.choice(("NVLX", "KORA", "BRIM")),
        "date": f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
        "price": f"{r.randint(20, 400)}.{r.randint(10, 99)}",
        "flight": f"LH{r.randint(100, 999)}",
        "airport": r.choice(("LIS", "OPO", "GDN", "BIO")),
        "gate": f"B{r.randint(1, 40)}",
        "temp": str(r.randint(4, 31)),
        "sky": r.choice(("clear", "light rain", "overcast")),
        "conference": f"{r.choice(('PyData', 'DevOpsDays', 'DataFest'))} {r.choice(CITIES)} 2025",
        "venue": f"{r.choice(('Congress', 'Expo', 'Harbour'))} Centre {r.randint(1, 9)}",
        "hotel": f"Hotel {r.choice(('Aurora', 'Miramar', 'Linden'))}",
        "night": str(r.randint(60, 240)),
        "patient": f"PT-{r.randint(10_000, 99_999)}",
        "drug": r.choice(("warfarin", "clarithromycin")),
        "current": r.choice(("simvastatin", "amiodarone")),
        "clinic": f"{r.choice(CITIES)} {r.choice(('North', 'Riverside'))} Clinic",
        "ref": f"ITM-{r.randint(1000, 9999)}",
        "person": person,
        "email": person.split()[0].lower() + "@example.org",
    }


def _template(name: str, index: int) -> Template:
    low = name.lower()
    for keywords, templates in FAMILIES:
        if not keywords or any(k in low for k in keywords):
            return templates[index % len(templates)]
    raise AssertionError("the generic family matches every domain")


def _chain(template: Template, values: dict[str, str]) -> dict[str, Any]:
    question, answer, steps = template
    subs = [
        {"id": f"q{i}", "question": q.format(**values), "answer": a.format(**values),
         "depends_on": [f"q{d}" for d in deps]}
        for i, (q, a, deps) in enumerate(steps, start=1)
    ]  # fmt: skip
    return {"question": question.format(**values), "answer": answer.format(**values),
            "subquestions": subs}  # fmt: skip


def _seed_chain(seed: dict[str, Any], values: dict[str, str]) -> dict[str, Any]:
    final = seed.get("answer") or f"{values['person']} ({values['ref']})"
    subs = [
        {"id": "q1", "question": f"Which record does this question concern: {seed['question']}",
         "answer": values["ref"], "depends_on": []},
        {"id": "q2", "question": "What does that record say that answers the question?",
         "answer": final, "depends_on": ["q1"]},
    ]  # fmt: skip
    return {"question": seed["question"], "answer": final, "subquestions": subs}


def _plant(chain: dict[str, Any], plants: set[str]) -> dict[str, Any]:
    subs: list[dict[str, Any]] = chain["subquestions"]
    first, last = subs[0], subs[-1]
    if "cycle" in plants:
        first["depends_on"] = [last["id"]]
        last["depends_on"] = list(dict.fromkeys([*last["depends_on"], first["id"]]))
    if "unknown_dep" in plants:
        last["depends_on"] = [*last["depends_on"], "q9"]
    if "dup_id" in plants:
        subs[1]["id"] = first["id"]
    if "dup_sub" in plants:
        subs.insert(1, {**first, "id": f"q{len(subs) + 1}", "question": first["question"].upper()})
    if "not_derived" in plants:
        chain["answer"] = "It cannot be said."
    if "short" in plants:
        del subs[1:]
    if "long" in plants:
        subs += [
            {"id": f"q{i}", "question": f"What is fact {i} about it?", "answer": f"fact {i}"}
            for i in range(len(subs) + 1, 8)
        ]
    if "unneeded" in plants:
        chain["question"] = f"We know it is {first['answer']}. {chain['question']}"
    if "ambiguous" in plants:
        first["question"] += " And when was it last checked?"
    if "bad_schema" in plants:
        return {"question": chain["question"], "subquestions": "first look it up, then answer"}
    return chain


def _plants(text: str) -> set[str]:
    return set(PLANT.findall(last_line(DOMAIN_LINE, text)))


def decompose_reply(text: str) -> dict[str, Any]:
    domain = json_line(DOMAIN_LINE, text, "{}")
    name = str(domain.get("name") or "general")
    seed = json_line(SEED_LINE, text, "null")
    index = int(last_line(INDEX_LINE, text) or 0)
    values = _values(name, index)
    chain = _seed_chain(seed, values) if seed else _chain(_template(name, index), values)
    return _plant(chain, _plants(text))


def necessity_reply(text: str) -> dict[str, Any]:
    question = json_line(QUESTION_LINE, text, '""')
    step = json_line(STEP_LINE, text, "{}")
    answer, sub = str(step.get("answer", "")), str(step.get("question", ""))
    if "necessity_schema" in _plants(text):
        return {"needs_tool": "yes", "reason": "a string, not a boolean"}
    if contains_answer(question, answer):
        return {"needs_tool": False, "reason": "the main question already states the answer"}
    if COMPUTE.match(sub):
        return {"needs_tool": False, "reason": "arithmetic over the earlier answers"}
    return {"needs_tool": True, "reason": "the answer is in records only a tool can read"}


def verify_reply(text: str) -> dict[str, Any]:
    chain = json_line(CHAIN_LINE, text, "{}")
    steps = [SubQuestion.model_validate(s) for s in chain.get("subquestions", [])]
    final = str(chain.get("answer", ""))
    complete = all(contains_answer(final, s.answer) for s in steps if s.id in sinks(steps))
    if "meh" in _plants(text):
        scores = {"dependency": 4, "atomicity": 4, "forced_serialization": 3, "completeness": 4}
    else:
        scores = {
            "dependency": 5,
            "atomicity": 2 if any(s.question.count("?") > 1 for s in steps) else 5,
            "forced_serialization": 4,
            "completeness": 5 if complete else 2,
        }
    return {**scores, "reason": "scored by rule"}


@rule("decompose", "necessity", "verify")
def scripted_reply(
    name: str, prompt_text: str, plants: ScriptedPlants | None = None
) -> dict[str, Any]:
    """The good answer to a ``decompose``, ``necessity`` or ``verify`` prompt (see the module;
    the plants are in the prompt)."""
    rules = {"decompose": decompose_reply, "necessity": necessity_reply, "verify": verify_reply}
    return rules[name](prompt_text)
