#!/usr/bin/env python3
"""Deterministic generator for the arena dataset (ASTRA-RL-1k record format, plus the
extra fields task_id / domain / reference).

    python3 eval/arenas/data/build.py      # from the repository root

Writes train.jsonl (4 tasks per domain) and heldout.jsonl (2 per domain) next to this file,
after every task has passed the in-process self-check (see ``check``). Standard library only.
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# --------------------------------------------------------------------------- shared helpers
# Helper code embedded in tool sources. Codes that tools mint (quote ids, confirmations,
# case ids...) are a short sha256 of their inputs, so gold answers can be computed here.
HASH_SRC = '''import hashlib


def _h(prefix, *parts):
    raw = "|".join(str(p).strip().lower() for p in parts)
    return prefix + "-" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:6].upper()'''

MONEY_SRC = '''def _m(cents):
    return "%d.%02d" % (cents // 100, cents % 100)'''

_ns = {}
exec(HASH_SRC, _ns)
H = _ns["_h"]  # the same function the tools use, to compute gold codes

TOOLS = {}  # domain -> tool name -> (schema, source)
TASKS = []  # in definition order


def fn(name, desc, params, opt=()):
    """OpenAI function schema; params = [(name, type, description[, enum])]."""
    props, req = {}, []
    for p in params:
        d = {"type": p[1], "description": p[2]}
        if len(p) > 3:
            d["enum"] = list(p[3])
        props[p[0]] = d
        if p[0] not in opt:
            req.append(p[0])
    return {"type": "function", "function": {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": req}}}


def tool(domain, name, desc, params, code, consts=None, helpers=(), opt=()):
    parts = list(helpers) + [f"{k} = {v!r}" for k, v in (consts or {}).items()]
    source = "\n\n\n".join(parts + [code.strip()]) + "\n"
    TOOLS.setdefault(domain, {})[name] = (fn(name, desc, params, opt), source)


def task(domain, prompt, chain, distractors):
    """chain = [(tool, arguments, gold or [golds])], one call per target tool, in order."""
    TASKS.append({"domain": domain, "prompt": prompt, "chain": chain,
                  "distractors": distractors})


# =========================================================================== bookings
HOTELS = {
    "H-4821": {"name": "Casa Alfama", "city": "Lisbon", "rating": "8.7",
               "address": "Rua de São Miguel 21", "amenities": ["wifi", "rooftop terrace"],
               "rooms": {"RM-A17": ["standard", 9600], "RM-A40": ["deluxe", 14250]}},
    "H-4907": {"name": "Tejo Grand", "city": "Lisbon", "rating": "9.1",
               "address": "Avenida da Liberdade 180", "amenities": ["wifi", "spa", "pool"],
               "rooms": {"RM-T02": ["standard", 15800], "RM-T88": ["suite", 31000]}},
    "H-5133": {"name": "Miradouro Inn", "city": "Lisbon", "rating": "8.2",
               "address": "Calçada do Monte 9", "amenities": ["wifi", "breakfast included"],
               "rooms": {"RM-M11": ["standard", 8850], "RM-M35": ["family", 13100]}},
    "H-6210": {"name": "Ribeira Lofts", "city": "Porto", "rating": "8.9",
               "address": "Rua da Fonte Taurina 14", "amenities": ["wifi", "kitchenette"],
               "rooms": {"RM-R05": ["standard", 11200], "RM-R19": ["deluxe", 16400]}},
    "H-6274": {"name": "Douro Palace", "city": "Porto", "rating": "9.4",
               "address": "Rua do Infante Dom Henrique 60", "amenities": ["wifi", "spa", "river view"],
               "rooms": {"RM-D01": ["standard", 20500], "RM-D77": ["suite", 38900]}},
    "H-7302": {"name": "Gion Ryokan", "city": "Kyoto", "rating": "9.6",
               "address": "Hanamikoji-dori 112", "amenities": ["onsen", "kaiseki dinner"],
               "rooms": {"RM-G08": ["standard", 18000], "RM-G21": ["deluxe", 26500]}},
    "H-7355": {"name": "Kamo River Hotel", "city": "Kyoto", "rating": "8.8",
               "address": "Kawabata-dori 45", "amenities": ["wifi", "bicycle rental"],
               "rooms": {"RM-K14": ["standard", 13400], "RM-K30": ["family", 19950]}},
    "H-8014": {"name": "Fjordlys Hotel", "city": "Oslo", "rating": "8.5",
               "address": "Karl Johans gate 33", "amenities": ["wifi", "sauna"],
               "rooms": {"RM-F03": ["standard", 14900], "RM-F12": ["deluxe", 21800]}},
    "H-8092": {"name": "Nordlys Suites", "city": "Oslo", "rating": "9.0",
               "address": "Bygdøy allé 7", "amenities": ["wifi", "gym", "harbour view"],
               "rooms": {"RM-N06": ["standard", 17100], "RM-N44": ["suite", 29800]}},
}
B = "bookings"
tool(B, "search_hotels",
     "Search hotels in a city. Returns hotel ids, names, guest ratings and each hotel's "
     "lowest nightly rate (EUR), cheapest first.",
     [("city", "string", "City name, e.g. 'Lisbon'"),
      ("max_rate", "number", "Optional upper bound on the lowest nightly rate, EUR")],
     opt=("max_rate",), consts={"HOTELS": HOTELS}, helpers=(MONEY_SRC,), code='''
def search_hotels(city, max_rate=None):
    c = str(city).strip().lower()
    rows = []
    for hid, h in HOTELS.items():
        if h["city"].lower() != c:
            continue
        low = min(r[1] for r in h["rooms"].values())
        if max_rate is not None:
            try:
                if low > float(max_rate) * 100:
                    continue
            except (TypeError, ValueError):
                return {"error": "max_rate must be a number"}
        rows.append((low, {"hotel_id": hid, "name": h["name"], "rating": h["rating"],
                           "from_rate": _m(low)}))
    if not rows:
        return {"error": "no hotels found in " + str(city)}
    rows.sort(key=lambda r: r[0])
    return {"city": str(city).strip(), "currency": "EUR", "results": [r[1] for r in rows]}
''')
tool(B, "get_hotel_details",
     "Full details of one hotel: address, amenities and its rooms (room codes, types, "
     "nightly rates).",
     [("hotel_id", "string", "Hotel id as returned by search_hotels, e.g. 'H-1234'")],
     consts={"HOTELS": HOTELS}, helpers=(MONEY_SRC,), code='''
def get_hotel_details(hotel_id):
    hid = str(hotel_id).strip().upper()
    h = HOTELS.get(hid)
    if h is None:
        return {"error": "unknown hotel id " + str(hotel_id)}
    rooms = [{"room_code": k, "type": v[0], "nightly_rate": _m(v[1])}
             for k, v in h["rooms"].items()]
    return {"hotel_id": hid, "name": h["name"], "city": h["city"], "address": h["address"],
            "rating": h["rating"], "amenities": h["amenities"], "currency": "EUR",
            "rooms": rooms}
''')
tool(B, "get_room_quote",
     "Price quote for a room: subtotal, 10% tax and total in EUR, plus a quote id needed "
     "to book.",
     [("hotel_id", "string", "Hotel id"),
      ("room_code", "string", "Room code from get_hotel_details, e.g. 'RM-X00'"),
      ("checkin", "string", "Check-in date, YYYY-MM-DD"),
      ("nights", "integer", "Number of nights (1-30)")],
     consts={"HOTELS": HOTELS}, helpers=(HASH_SRC, MONEY_SRC), code='''
def get_room_quote(hotel_id, room_code, checkin, nights):
    import re
    hid = str(hotel_id).strip().upper()
    h = HOTELS.get(hid)
    if h is None:
        return {"error": "unknown hotel id " + str(hotel_id)}
    rc = str(room_code).strip().upper()
    if rc not in h["rooms"]:
        return {"error": "room " + str(room_code) + " is not offered by " + hid}
    day = str(checkin).strip()
    if not re.fullmatch(r"\\d{4}-\\d{2}-\\d{2}", day):
        return {"error": "checkin must be YYYY-MM-DD"}
    try:
        n = int(nights)
    except (TypeError, ValueError):
        return {"error": "nights must be an integer"}
    if not 1 <= n <= 30:
        return {"error": "nights must be between 1 and 30"}
    sub = h["rooms"][rc][1] * n
    tax = (sub + 5) // 10
    return {"quote_id": _h("QT", hid, rc, day, n), "hotel_id": hid, "room_code": rc,
            "room_type": h["rooms"][rc][0], "checkin": day, "nights": n,
            "subtotal": _m(sub), "tax": _m(tax), "total": _m(sub + tax), "currency": "EUR"}
''')
tool(B, "book_room",
     "Book a room from a price quote. Returns the booking confirmation code.",
     [("quote_id", "string", "Quote id from get_room_quote, e.g. 'QT-000000'"),
      ("guest_name", "string", "Full name of the guest")],
     helpers=(HASH_SRC,), code='''
def book_room(quote_id, guest_name):
    import re
    q = str(quote_id).strip().upper()
    if not re.fullmatch(r"QT-[0-9A-F]{6}", q):
        return {"error": "unknown quote id " + str(quote_id)}
    g = " ".join(str(guest_name).split())
    if not g:
        return {"error": "guest_name is required"}
    return {"confirmation_code": _h("CNF", q, g), "quote_id": q, "guest_name": g,
            "status": "confirmed"}
''')
tool(B, "get_checkin_instructions",
     "Self check-in instructions for a confirmed booking, including the digital room key.",
     [("confirmation_code", "string", "Booking confirmation code, e.g. 'CNF-000000'")],
     helpers=(HASH_SRC,), code='''
def get_checkin_instructions(confirmation_code):
    import re
    c = str(confirmation_code).strip().upper()
    if not re.fullmatch(r"CNF-[0-9A-F]{6}", c):
        return {"error": "unknown confirmation code " + str(confirmation_code)}
    return {"confirmation_code": c, "checkin_from": "15:00", "checkout_by": "11:00",
            "digital_key": _h("KEY", c),
            "note": "Show the digital key at the self check-in kiosk in the lobby."}
''')
tool(B, "search_flights", "Search direct flights between two cities on a date.",
     [("origin", "string", "Departure city"), ("destination", "string", "Arrival city"),
      ("date", "string", "Travel date, YYYY-MM-DD")],
     consts={"FLIGHTS": {("london", "lisbon"): [["TP1351", "07:15", "189.00"],
                                                 ["BA500", "12:40", "214.00"]],
                         ("paris", "porto"): [["TP443", "09:05", "132.00"]],
                         ("tokyo", "osaka"): [["JL123", "08:00", "96.00"]]}}, code='''
def search_flights(origin, destination, date):
    key = (str(origin).strip().lower(), str(destination).strip().lower())
    rows = FLIGHTS.get(key)
    if not rows:
        return {"error": "no direct flights from " + str(origin) + " to " + str(destination)}
    return {"date": str(date), "flights": [{"flight": f, "departs": t, "fare_eur": p}
                                           for f, t, p in rows]}
''')
tool(B, "convert_currency", "Convert an amount between currencies at today's reference rate.",
     [("amount", "number", "Amount to convert"), ("from_currency", "string", "ISO code"),
      ("to_currency", "string", "ISO code")],
     consts={"RATES": {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "JPY": 162.4, "NOK": 11.6}},
     code='''
def convert_currency(amount, from_currency, to_currency):
    a, b = str(from_currency).strip().upper(), str(to_currency).strip().upper()
    if a not in RATES or b not in RATES:
        return {"error": "unsupported currency pair " + a + "/" + b}
    try:
        value = float(amount)
    except (TypeError, ValueError):
        return {"error": "amount must be a number"}
    return {"amount": "%.2f" % (value / RATES[a] * RATES[b]), "currency": b}
''')
tool(B, "get_restaurant_reviews", "Top-rated restaurants near the centre of a city.",
     [("city", "string", "City name")],
     consts={"REVIEWS": {"lisbon": [["Taberna do Largo", "4.6"], ["Cervejaria Ramiro", "4.7"]],
                         "porto": [["Cantinho do Avillez", "4.5"]],
                         "kyoto": [["Menbaka Fire Ramen", "4.4"]],
                         "oslo": [["Fiskeriet Youngstorget", "4.5"]]}}, code='''
def get_restaurant_reviews(city):
    rows = REVIEWS.get(str(city).strip().lower())
    if rows is None:
        return {"error": "no reviews for " + str(city)}
    return {"city": str(city), "restaurants": [{"name": n, "stars": s} for n, s in rows]}
''')

q3 = H("QT", "H-4907", "RM-T02", "2025-05-14", 3)
c3 = H("CNF", q3, "Dana Reyes")
q4 = H("QT", "H-8014", "RM-F12", "2025-12-19", 2)
c4 = H("CNF", q4, "Tomas Lindqvist")
q6 = H("QT", "H-5133", "RM-M35", "2025-07-10", 6)
c6 = H("CNF", q6, "Aiko Mensah")
task(B, "I'm spending a weekend in Porto and want to walk past the cheapest hotel before I "
        "commit. Find the Porto hotel with the lowest starting nightly rate and tell me its "
        "street address.",
     [("search_hotels", {"city": "Porto"}, "H-6210"),
      ("get_hotel_details", {"hotel_id": "H-6210"}, "Rua da Fonte Taurina 14")],
     ["get_room_quote", "search_flights"])
task(B, "We're a family of four heading to Kyoto. Of the Kyoto hotels, take the one with the "
        "LOWER guest rating (it has family rooms), and get a price quote for its family room: "
        "check-in 2025-10-06, 4 nights. What is the total including tax?",
     [("search_hotels", {"city": "Kyoto"}, "H-7355"),
      ("get_hotel_details", {"hotel_id": "H-7355"}, "RM-K30"),
      ("get_room_quote", {"hotel_id": "H-7355", "room_code": "RM-K30",
                          "checkin": "2025-10-06", "nights": 4}, "877.80")],
     ["book_room", "convert_currency"])
task(B, "Please book the highest-rated hotel in Lisbon for Dana Reyes: a standard room, "
        "check-in 2025-05-14 for 3 nights. Get a quote first, then book it, and give me the "
        "confirmation code and the total price.",
     [("search_hotels", {"city": "Lisbon"}, "H-4907"),
      ("get_hotel_details", {"hotel_id": "H-4907"}, "RM-T02"),
      ("get_room_quote", {"hotel_id": "H-4907", "room_code": "RM-T02",
                          "checkin": "2025-05-14", "nights": 3}, "521.40"),
      ("book_room", {"quote_id": q3, "guest_name": "Dana Reyes"}, c3)],
     ["get_checkin_instructions", "get_restaurant_reviews", "search_flights"])
task(B, "Tomas Lindqvist is arriving in Oslo late at night on 2025-12-19 and will use the "
        "self check-in kiosk. Book the deluxe room at the Oslo hotel with the cheapest "
        "starting rate for 2 nights (quote it, then book it in his name), then fetch the "
        "check-in instructions and tell me his digital key.",
     [("search_hotels", {"city": "Oslo"}, "H-8014"),
      ("get_hotel_details", {"hotel_id": "H-8014"}, "RM-F12"),
      ("get_room_quote", {"hotel_id": "H-8014", "room_code": "RM-F12",
                          "checkin": "2025-12-19", "nights": 2}, "479.60"),
      ("book_room", {"quote_id": q4, "guest_name": "Tomas Lindqvist"}, c4),
      ("get_checkin_instructions", {"confirmation_code": c4}, H("KEY", c4))],
     ["convert_currency"])
task(B, "My parents' anniversary trip: they want the suite at the best-rated hotel in Porto, "
        "checking in 2025-08-01 for 5 nights. Just get a price quote (don't book) and tell "
        "me the total with tax.",
     [("search_hotels", {"city": "Porto"}, "H-6274"),
      ("get_hotel_details", {"hotel_id": "H-6274"}, "RM-D77"),
      ("get_room_quote", {"hotel_id": "H-6274", "room_code": "RM-D77",
                          "checkin": "2025-08-01", "nights": 5}, "2139.50")],
     ["book_room", "get_restaurant_reviews"])
task(B, "Aiko Mensah needs a family room in Lisbon from 2025-07-10 for 6 nights, at the Lisbon "
        "hotel with the lowest starting rate. Quote it, book it in her name, and then get the "
        "check-in instructions: I need her digital key.",
     [("search_hotels", {"city": "Lisbon"}, "H-5133"),
      ("get_hotel_details", {"hotel_id": "H-5133"}, "RM-M35"),
      ("get_room_quote", {"hotel_id": "H-5133", "room_code": "RM-M35",
                          "checkin": "2025-07-10", "nights": 6}, "864.60"),
      ("book_room", {"quote_id": q6, "guest_name": "Aiko Mensah"}, c6),
      ("get_checkin_instructions", {"confirmation_code": c6}, H("KEY", c6))],
     ["search_flights", "convert_currency"])

# @@DOMAINS@@


# =========================================================================== build + check
def as_text(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def norm(text):
    return " ".join(str(text).split()).lower()


def record(t, task_id):
    targets = [c[0] for c in t["chain"]]
    pool = TOOLS[t["domain"]]
    names = sorted(targets + t["distractors"])  # sorted: the listing does not reveal the order
    return {
        "prompt": [{"role": "user", "content": t["prompt"]}],
        "tool_schema": json.dumps([pool[n][0] for n in names], ensure_ascii=False),
        "tool_dict": json.dumps({n: pool[n][1] for n in names}, ensure_ascii=False),
        "sub_qa_dict": json.dumps({c[0]: c[2] if isinstance(c[2], list) else [c[2]]
                                   for c in t["chain"]}, ensure_ascii=False),
        "task_id": task_id,
        "domain": t["domain"],
        "reference": [{"name": c[0], "arguments": c[1]} for c in t["chain"]],
    }


BOGUS = {"string": "ZZ-404", "integer": 1, "number": 1.5, "boolean": True}


def check(rec):
    tid = rec["task_id"]

    def need(ok, msg):
        if not ok:
            sys.exit(f"SELF-CHECK FAILED [{tid}]: {msg}")

    schema = json.loads(rec["tool_schema"])
    sources = json.loads(rec["tool_dict"])
    sub_qa = json.loads(rec["sub_qa_dict"])
    prompt = rec["prompt"]
    need(isinstance(prompt, list) and len(prompt) == 1 and prompt[0]["role"] == "user",
         "prompt must be one user message")
    ptext = norm(prompt[0]["content"])
    names = [s["function"]["name"] for s in schema]
    need(all(s["type"] == "function" and s["function"]["parameters"]["type"] == "object"
             for s in schema), "malformed schema")
    need(len(names) == len(set(names)), "duplicate schema names")
    need(set(names) == set(sources), f"schema names {names} != tool_dict keys {list(sources)}")
    need(set(sub_qa) <= set(names), "sub_qa tools not all in schema")
    funcs = {}
    for name, source in sources.items():
        ns = {}
        exec(compile(source, f"<{tid}:{name}>", "exec"), ns)
        need(callable(ns.get(name)), f"source of {name} does not define {name}")
        funcs[name] = ns[name]
    for s in schema:  # robustness: bogus arguments must give an error value, not raise
        f = s["function"]
        args = {p: BOGUS[d["type"]] for p, d in f["parameters"]["properties"].items()
                if p in f["parameters"]["required"]}
        try:
            out = funcs[f["name"]](**args)
            json.dumps(out)
        except Exception as exc:  # noqa: BLE001
            need(False, f"{f['name']}(**{args}) raised {exc!r}")
        need(isinstance(out, (str, dict, list)), f"{f['name']} returned {type(out)}")
    ref = rec["reference"]
    need(2 <= len(ref) <= 5, f"chain length {len(ref)}")
    need([c["name"] for c in ref] == list(sub_qa) and len(ref) == len(set(sub_qa)),
         "reference must call exactly the sub_qa tools, once each")
    n_distract = len(names) - len(sub_qa)
    need(1 <= n_distract <= 3, f"{n_distract} distractors")
    outs = []
    for i, call in enumerate(ref):
        name, args = call["name"], call["arguments"]
        props = next(s["function"]["parameters"] for s in schema
                     if s["function"]["name"] == name)
        need(set(props["required"]) <= set(args) <= set(props["properties"]),
             f"{name} arguments {sorted(args)} do not fit its schema")
        text = as_text(funcs[name](**args))
        need("error" not in text.lower()[:12], f"{name} returned an error: {text}")
        golds = sub_qa[name]
        need(any(norm(g) in norm(text) for g in golds), f"{name} output {text!r} lacks {golds}")
        for g in golds:
            need(len(g.strip()) >= 3, f"gold {g!r} too short")
            need(norm(g) not in ptext, f"gold {g!r} appears in the prompt")
            need(all(norm(g) not in norm(o) for o in outs),
                 f"gold {g!r} of {name} already appears in an earlier output")
        if i:
            earlier = "\n".join(outs)
            linked = [str(v) for v in args.values() if str(v) in earlier]
            need(linked, f"{name}: no argument comes from an earlier output")
            need(any(norm(v) not in ptext for v in linked),
                 f"{name}: its linking value(s) {linked} appear in the prompt")
        outs.append(text)


def main():
    train, heldout, seen = [], [], {}
    for t in TASKS:
        d = t["domain"]
        seen[d] = seen.get(d, 0) + 1
        rec = record(t, f"{d}-{seen[d]:02d}")
        check(rec)
        (train if seen[d] <= 4 else heldout).append(rec)
    problems = [f"{d}: {n} tasks" for d, n in seen.items() if n != 6]
    if len(seen) != 6 or problems:
        sys.exit(f"SELF-CHECK FAILED: need 6 domains x 6 tasks, got {seen}")
    prompts = [r["prompt"][0]["content"] for r in train + heldout]
    if len(set(prompts)) != len(prompts):
        sys.exit("SELF-CHECK FAILED: duplicate prompts")
    blobs = {}
    for fname, recs in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        blobs[fname] = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    size = sum(len(b.encode("utf-8")) for b in blobs.values())
    if size >= 1_000_000:
        sys.exit(f"SELF-CHECK FAILED: output is {size} bytes")
    for fname, blob in blobs.items():
        with open(os.path.join(HERE, fname), "w", encoding="utf-8") as fh:
            fh.write(blob)
    lengths = {}
    for r in train + heldout:
        lengths[len(r["reference"])] = lengths.get(len(r["reference"]), 0) + 1
    print(f"ok: {len(train)} train + {len(heldout)} heldout tasks, {size} bytes; "
          f"chain lengths {dict(sorted(lengths.items()))}")


if __name__ == "__main__":
    main()
