#!/usr/bin/env python3
"""Deterministic generator for the arena dataset (ASTRA-RL-1k record format, plus the
extra fields task_id / domain / reference).

    python3 eval/arenas/data/build.py      # from the repository root

Writes train.jsonl (4 tasks per domain) and heldout.jsonl (2 per domain) next to this file,
after every task has passed the in-process self-check (see ``check``). Standard library only.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# --------------------------------------------------------------------------- shared helpers
# Helper code embedded in tool sources. Codes that tools mint (quote ids, confirmations,
# case ids...) are a short sha256 of their inputs, so gold answers can be computed here.
HASH_SRC = """import hashlib


def _h(prefix, *parts):
    raw = "|".join(str(p).strip().lower() for p in parts)
    return prefix + "-" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:6].upper()"""

MONEY_SRC = """def _m(cents):
    return "%d.%02d" % (cents // 100, cents % 100)"""

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
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": req},
        },
    }


def tool(domain, name, desc, params, code, consts=None, helpers=(), opt=()):
    parts = list(helpers) + [f"{k} = {v!r}" for k, v in (consts or {}).items()]
    source = "\n\n\n".join(parts + [code.strip()]) + "\n"
    TOOLS.setdefault(domain, {})[name] = (fn(name, desc, params, opt), source)


def task(domain, prompt, chain, distractors):
    """chain = [(tool, arguments, gold or [golds])], one call per target tool, in order."""
    TASKS.append({"domain": domain, "prompt": prompt, "chain": chain, "distractors": distractors})


# =========================================================================== bookings
HOTELS = {
    "H-4821": {
        "name": "Casa Alfama",
        "city": "Lisbon",
        "rating": "8.7",
        "address": "Rua de São Miguel 21",
        "amenities": ["wifi", "rooftop terrace"],
        "rooms": {"RM-A17": ["standard", 9600], "RM-A40": ["deluxe", 14250]},
    },
    "H-4907": {
        "name": "Tejo Grand",
        "city": "Lisbon",
        "rating": "9.1",
        "address": "Avenida da Liberdade 180",
        "amenities": ["wifi", "spa", "pool"],
        "rooms": {"RM-T02": ["standard", 15800], "RM-T88": ["suite", 31000]},
    },
    "H-5133": {
        "name": "Miradouro Inn",
        "city": "Lisbon",
        "rating": "8.2",
        "address": "Calçada do Monte 9",
        "amenities": ["wifi", "breakfast included"],
        "rooms": {"RM-M11": ["standard", 8850], "RM-M35": ["family", 13100]},
    },
    "H-6210": {
        "name": "Ribeira Lofts",
        "city": "Porto",
        "rating": "8.9",
        "address": "Rua da Fonte Taurina 14",
        "amenities": ["wifi", "kitchenette"],
        "rooms": {"RM-R05": ["standard", 11200], "RM-R19": ["deluxe", 16400]},
    },
    "H-6274": {
        "name": "Douro Palace",
        "city": "Porto",
        "rating": "9.4",
        "address": "Rua do Infante Dom Henrique 60",
        "amenities": ["wifi", "spa", "river view"],
        "rooms": {"RM-D01": ["standard", 20500], "RM-D77": ["suite", 38900]},
    },
    "H-7302": {
        "name": "Gion Ryokan",
        "city": "Kyoto",
        "rating": "9.6",
        "address": "Hanamikoji-dori 112",
        "amenities": ["onsen", "kaiseki dinner"],
        "rooms": {"RM-G08": ["standard", 18000], "RM-G21": ["deluxe", 26500]},
    },
    "H-7355": {
        "name": "Kamo River Hotel",
        "city": "Kyoto",
        "rating": "8.8",
        "address": "Kawabata-dori 45",
        "amenities": ["wifi", "bicycle rental"],
        "rooms": {"RM-K14": ["standard", 13400], "RM-K30": ["family", 19950]},
    },
    "H-8014": {
        "name": "Fjordlys Hotel",
        "city": "Oslo",
        "rating": "8.5",
        "address": "Karl Johans gate 33",
        "amenities": ["wifi", "sauna"],
        "rooms": {"RM-F03": ["standard", 14900], "RM-F12": ["deluxe", 21800]},
    },
    "H-8092": {
        "name": "Nordlys Suites",
        "city": "Oslo",
        "rating": "9.0",
        "address": "Bygdøy allé 7",
        "amenities": ["wifi", "gym", "harbour view"],
        "rooms": {"RM-N06": ["standard", 17100], "RM-N44": ["suite", 29800]},
    },
}
B = "bookings"
tool(
    B,
    "search_hotels",
    "Search hotels in a city. Returns hotel ids, names, guest ratings and each hotel's "
    "lowest nightly rate (EUR), cheapest first.",
    [
        ("city", "string", "City name, e.g. 'Lisbon'"),
        ("max_rate", "number", "Optional upper bound on the lowest nightly rate, EUR"),
    ],
    opt=("max_rate",),
    consts={"HOTELS": HOTELS},
    helpers=(MONEY_SRC,),
    code="""
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
""",
)
tool(
    B,
    "get_hotel_details",
    "Full details of one hotel: address, amenities and its rooms (room codes, types, "
    "nightly rates).",
    [("hotel_id", "string", "Hotel id as returned by search_hotels, e.g. 'H-1234'")],
    consts={"HOTELS": HOTELS},
    helpers=(MONEY_SRC,),
    code="""
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
""",
)
tool(
    B,
    "get_room_quote",
    "Price quote for a room: subtotal, 10% tax and total in EUR, plus a quote id needed to book.",
    [
        ("hotel_id", "string", "Hotel id"),
        ("room_code", "string", "Room code from get_hotel_details, e.g. 'RM-X00'"),
        ("checkin", "string", "Check-in date, YYYY-MM-DD"),
        ("nights", "integer", "Number of nights (1-30)"),
    ],
    consts={"HOTELS": HOTELS},
    helpers=(HASH_SRC, MONEY_SRC),
    code="""
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
""",
)
tool(
    B,
    "book_room",
    "Book a room from a price quote. Returns the booking confirmation code.",
    [
        ("quote_id", "string", "Quote id from get_room_quote, e.g. 'QT-000000'"),
        ("guest_name", "string", "Full name of the guest"),
    ],
    helpers=(HASH_SRC,),
    code="""
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
""",
)
tool(
    B,
    "get_checkin_instructions",
    "Self check-in instructions for a confirmed booking, including the digital room key.",
    [("confirmation_code", "string", "Booking confirmation code, e.g. 'CNF-000000'")],
    helpers=(HASH_SRC,),
    code="""
def get_checkin_instructions(confirmation_code):
    import re
    c = str(confirmation_code).strip().upper()
    if not re.fullmatch(r"CNF-[0-9A-F]{6}", c):
        return {"error": "unknown confirmation code " + str(confirmation_code)}
    return {"confirmation_code": c, "checkin_from": "15:00", "checkout_by": "11:00",
            "digital_key": _h("KEY", c),
            "note": "Show the digital key at the self check-in kiosk in the lobby."}
""",
)
tool(
    B,
    "search_flights",
    "Search direct flights between two cities on a date.",
    [
        ("origin", "string", "Departure city"),
        ("destination", "string", "Arrival city"),
        ("date", "string", "Travel date, YYYY-MM-DD"),
    ],
    consts={
        "FLIGHTS": {
            ("london", "lisbon"): [["TP1351", "07:15", "189.00"], ["BA500", "12:40", "214.00"]],
            ("paris", "porto"): [["TP443", "09:05", "132.00"]],
            ("tokyo", "osaka"): [["JL123", "08:00", "96.00"]],
        }
    },
    code="""
def search_flights(origin, destination, date):
    key = (str(origin).strip().lower(), str(destination).strip().lower())
    rows = FLIGHTS.get(key)
    if not rows:
        return {"error": "no direct flights from " + str(origin) + " to " + str(destination)}
    return {"date": str(date), "flights": [{"flight": f, "departs": t, "fare_eur": p}
                                           for f, t, p in rows]}
""",
)
tool(
    B,
    "convert_currency",
    "Convert an amount between currencies at today's reference rate.",
    [
        ("amount", "number", "Amount to convert"),
        ("from_currency", "string", "ISO code"),
        ("to_currency", "string", "ISO code"),
    ],
    consts={"RATES": {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "JPY": 162.4, "NOK": 11.6}},
    code="""
def convert_currency(amount, from_currency, to_currency):
    a, b = str(from_currency).strip().upper(), str(to_currency).strip().upper()
    if a not in RATES or b not in RATES:
        return {"error": "unsupported currency pair " + a + "/" + b}
    try:
        value = float(amount)
    except (TypeError, ValueError):
        return {"error": "amount must be a number"}
    return {"amount": "%.2f" % (value / RATES[a] * RATES[b]), "currency": b}
""",
)
tool(
    B,
    "get_restaurant_reviews",
    "Top-rated restaurants near the centre of a city.",
    [("city", "string", "City name")],
    consts={
        "REVIEWS": {
            "lisbon": [["Taberna do Largo", "4.6"], ["Cervejaria Ramiro", "4.7"]],
            "porto": [["Cantinho do Avillez", "4.5"]],
            "kyoto": [["Menbaka Fire Ramen", "4.4"]],
            "oslo": [["Fiskeriet Youngstorget", "4.5"]],
        }
    },
    code="""
def get_restaurant_reviews(city):
    rows = REVIEWS.get(str(city).strip().lower())
    if rows is None:
        return {"error": "no reviews for " + str(city)}
    return {"city": str(city), "restaurants": [{"name": n, "stars": s} for n, s in rows]}
""",
)

q3 = H("QT", "H-4907", "RM-T02", "2025-05-14", 3)
c3 = H("CNF", q3, "Dana Reyes")
q4 = H("QT", "H-8014", "RM-F12", "2025-12-19", 2)
c4 = H("CNF", q4, "Tomas Lindqvist")
q6 = H("QT", "H-5133", "RM-M35", "2025-07-10", 6)
c6 = H("CNF", q6, "Aiko Mensah")
task(
    B,
    "I'm spending a weekend in Porto and want to walk past the cheapest hotel before I "
    "commit. Find the Porto hotel with the lowest starting nightly rate and tell me its "
    "street address.",
    [
        ("search_hotels", {"city": "Porto"}, "H-6210"),
        ("get_hotel_details", {"hotel_id": "H-6210"}, "Rua da Fonte Taurina 14"),
    ],
    ["get_room_quote", "search_flights"],
)
task(
    B,
    "We're a family of four heading to Kyoto. Of the Kyoto hotels, take the one with the "
    "LOWER guest rating (it has family rooms), and get a price quote for its family room: "
    "check-in 2025-10-06, 4 nights. What is the total including tax?",
    [
        ("search_hotels", {"city": "Kyoto"}, "H-7355"),
        ("get_hotel_details", {"hotel_id": "H-7355"}, "RM-K30"),
        (
            "get_room_quote",
            {"hotel_id": "H-7355", "room_code": "RM-K30", "checkin": "2025-10-06", "nights": 4},
            "877.80",
        ),
    ],
    ["book_room", "convert_currency"],
)
task(
    B,
    "Please book the highest-rated hotel in Lisbon for Dana Reyes: a standard room, "
    "check-in 2025-05-14 for 3 nights. Get a quote first, then book it, and give me the "
    "confirmation code and the total price.",
    [
        ("search_hotels", {"city": "Lisbon"}, "H-4907"),
        ("get_hotel_details", {"hotel_id": "H-4907"}, "RM-T02"),
        (
            "get_room_quote",
            {"hotel_id": "H-4907", "room_code": "RM-T02", "checkin": "2025-05-14", "nights": 3},
            "521.40",
        ),
        ("book_room", {"quote_id": q3, "guest_name": "Dana Reyes"}, c3),
    ],
    ["get_checkin_instructions", "get_restaurant_reviews", "search_flights"],
)
task(
    B,
    "Tomas Lindqvist is arriving in Oslo late at night on 2025-12-19 and will use the "
    "self check-in kiosk. Book the deluxe room at the Oslo hotel with the cheapest "
    "starting rate for 2 nights (quote it, then book it in his name), then fetch the "
    "check-in instructions and tell me his digital key.",
    [
        ("search_hotels", {"city": "Oslo"}, "H-8014"),
        ("get_hotel_details", {"hotel_id": "H-8014"}, "RM-F12"),
        (
            "get_room_quote",
            {"hotel_id": "H-8014", "room_code": "RM-F12", "checkin": "2025-12-19", "nights": 2},
            "479.60",
        ),
        ("book_room", {"quote_id": q4, "guest_name": "Tomas Lindqvist"}, c4),
        ("get_checkin_instructions", {"confirmation_code": c4}, H("KEY", c4)),
    ],
    ["convert_currency"],
)
task(
    B,
    "My parents' anniversary trip: they want the suite at the best-rated hotel in Porto, "
    "checking in 2025-08-01 for 5 nights. Just get a price quote (don't book) and tell "
    "me the total with tax.",
    [
        ("search_hotels", {"city": "Porto"}, "H-6274"),
        ("get_hotel_details", {"hotel_id": "H-6274"}, "RM-D77"),
        (
            "get_room_quote",
            {"hotel_id": "H-6274", "room_code": "RM-D77", "checkin": "2025-08-01", "nights": 5},
            "2139.50",
        ),
    ],
    ["book_room", "get_restaurant_reviews"],
)
task(
    B,
    "Aiko Mensah needs a family room in Lisbon from 2025-07-10 for 6 nights, at the Lisbon "
    "hotel with the lowest starting rate. Quote it, book it in her name, and then get the "
    "check-in instructions: I need her digital key.",
    [
        ("search_hotels", {"city": "Lisbon"}, "H-5133"),
        ("get_hotel_details", {"hotel_id": "H-5133"}, "RM-M35"),
        (
            "get_room_quote",
            {"hotel_id": "H-5133", "room_code": "RM-M35", "checkin": "2025-07-10", "nights": 6},
            "864.60",
        ),
        ("book_room", {"quote_id": q6, "guest_name": "Aiko Mensah"}, c6),
        ("get_checkin_instructions", {"confirmation_code": c6}, H("KEY", c6)),
    ],
    ["search_flights", "convert_currency"],
)

# =========================================================================== inventory
PRODUCTS = {  # sku: [name, category, on hand per warehouse, reorder point, supplier]
    "SKU-30118": [
        "Aurora Bluetooth Headset",
        "audio",
        {"WH-NORTH": 42, "WH-EAST": 7, "WH-SOUTH": 118},
        60,
        "SUP-218",
    ],
    "SKU-30155": [
        "Aurora Wired Headset",
        "audio",
        {"WH-NORTH": 88, "WH-EAST": 31, "WH-SOUTH": 12},
        40,
        "SUP-218",
    ],
    "SKU-41207": [
        "Granite 27in Monitor",
        "displays",
        {"WH-NORTH": 19, "WH-EAST": 64, "WH-SOUTH": 5},
        30,
        "SUP-305",
    ],
    "SKU-41290": [
        "Granite 32in Curved Monitor",
        "displays",
        {"WH-NORTH": 3, "WH-EAST": 26, "WH-SOUTH": 14},
        20,
        "SUP-305",
    ],
    "SKU-52044": [
        "Tern Ergonomic Chair",
        "furniture",
        {"WH-NORTH": 11, "WH-EAST": 0, "WH-SOUTH": 23},
        25,
        "SUP-412",
    ],
    "SKU-52071": [
        "Tern Standing Desk",
        "furniture",
        {"WH-NORTH": 56, "WH-EAST": 9, "WH-SOUTH": 33},
        20,
        "SUP-412",
    ],
    "SKU-63310": [
        "Pulse USB-C Dock",
        "accessories",
        {"WH-NORTH": 140, "WH-EAST": 72, "WH-SOUTH": 8},
        100,
        "SUP-527",
    ],
}
SUPPLIERS = {
    "SUP-218": {
        "name": "Harbor Audio Ltd",
        "vendor_account": "VA-77310",
        "lead_time_days": 12,
        "email": "orders@harboraudio.example",
        "costs": {"SKU-30118": 2450, "SKU-30155": 1175},
    },
    "SUP-305": {
        "name": "Lumen Panel Co",
        "vendor_account": "VA-81942",
        "lead_time_days": 21,
        "email": "sales@lumenpanel.example",
        "costs": {"SKU-41207": 18900, "SKU-41290": 31250},
    },
    "SUP-412": {
        "name": "Tern Workspace GmbH",
        "vendor_account": "VA-60288",
        "lead_time_days": 30,
        "email": "b2b@ternworkspace.example",
        "costs": {"SKU-52044": 21475, "SKU-52071": 38800},
    },
    "SUP-527": {
        "name": "Pulse Peripherals Inc",
        "vendor_account": "VA-93015",
        "lead_time_days": 9,
        "email": "po@pulseperipherals.example",
        "costs": {"SKU-63310": 6390},
    },
}
WAREHOUSES = {
    "WH-NORTH": ["Minneapolis, MN", "Dock 4"],
    "WH-EAST": ["Columbus, OH", "Dock 11"],
    "WH-SOUTH": ["Dallas, TX", "Dock 2"],
}
I = "inventory"
tool(
    I,
    "find_product",
    "Find products whose name contains all the given words. Returns SKUs.",
    [("query", "string", "Words from the product name")],
    consts={"PRODUCTS": PRODUCTS},
    code="""
def find_product(query):
    words = str(query).lower().split()
    if not words:
        return {"error": "empty query"}
    hits = [{"sku": s, "name": p[0], "category": p[1]} for s, p in PRODUCTS.items()
            if all(w in p[0].lower() for w in words)]
    if not hits:
        return {"error": "no product matches " + str(query)}
    return {"matches": hits}
""",
)
tool(
    I,
    "get_stock_levels",
    "On-hand stock of a SKU in every warehouse, its reorder point and primary supplier id.",
    [("sku", "string", "Product SKU, e.g. 'SKU-00000'")],
    consts={"PRODUCTS": PRODUCTS},
    code="""
def get_stock_levels(sku):
    key = str(sku).strip().upper()
    p = PRODUCTS.get(key)
    if p is None:
        return {"error": "unknown sku " + str(sku)}
    return {"sku": key, "name": p[0],
            "warehouses": [{"warehouse_id": w, "on_hand": q} for w, q in p[2].items()],
            "total_on_hand": sum(p[2].values()), "reorder_point": p[3],
            "primary_supplier_id": p[4]}
""",
)
tool(
    I,
    "get_supplier",
    "Supplier profile: name, vendor account number (needed for purchase orders), lead time, "
    "order email and price list.",
    [("supplier_id", "string", "Supplier id, e.g. 'SUP-000'")],
    consts={"SUPPLIERS": SUPPLIERS},
    helpers=(MONEY_SRC,),
    code="""
def get_supplier(supplier_id):
    key = str(supplier_id).strip().upper()
    s = SUPPLIERS.get(key)
    if s is None:
        return {"error": "unknown supplier id " + str(supplier_id)}
    return {"supplier_id": key, "name": s["name"], "vendor_account": s["vendor_account"],
            "lead_time_days": s["lead_time_days"], "order_email": s["email"],
            "price_list": [{"sku": k, "unit_cost": _m(v)} for k, v in s["costs"].items()]}
""",
)
tool(
    I,
    "create_purchase_order",
    "Create a purchase order with a supplier (identified by vendor account) for one SKU.",
    [
        ("vendor_account", "string", "Supplier vendor account, e.g. 'VA-00000'"),
        ("sku", "string", "Product SKU"),
        ("quantity", "integer", "Units to order"),
    ],
    consts={"SUPPLIERS": SUPPLIERS},
    helpers=(HASH_SRC, MONEY_SRC),
    code="""
def create_purchase_order(vendor_account, sku, quantity):
    va = str(vendor_account).strip().upper()
    sup = next((s for s in SUPPLIERS.values() if s["vendor_account"] == va), None)
    if sup is None:
        return {"error": "unknown vendor account " + str(vendor_account)}
    key = str(sku).strip().upper()
    if key not in sup["costs"]:
        return {"error": sup["name"] + " does not supply " + str(sku)}
    try:
        q = int(quantity)
    except (TypeError, ValueError):
        return {"error": "quantity must be an integer"}
    if q <= 0:
        return {"error": "quantity must be positive"}
    return {"po_number": _h("PO", va, key, q), "supplier": sup["name"], "sku": key,
            "quantity": q, "unit_cost": _m(sup["costs"][key]),
            "total": _m(sup["costs"][key] * q), "currency": "USD", "status": "submitted"}
""",
)
tool(
    I,
    "schedule_delivery",
    "Schedule inbound delivery of a purchase order to a warehouse dock.",
    [
        ("po_number", "string", "Purchase order number, e.g. 'PO-000000'"),
        ("warehouse_id", "string", "Destination warehouse id"),
    ],
    consts={"WAREHOUSES": WAREHOUSES},
    helpers=(HASH_SRC,),
    code="""
def schedule_delivery(po_number, warehouse_id):
    import re
    po = str(po_number).strip().upper()
    if not re.fullmatch(r"PO-[0-9A-F]{6}", po):
        return {"error": "unknown purchase order " + str(po_number)}
    wh = str(warehouse_id).strip().upper()
    if wh not in WAREHOUSES:
        return {"error": "unknown warehouse " + str(warehouse_id)}
    return {"delivery_id": _h("DLV", po, wh), "po_number": po, "warehouse_id": wh,
            "city": WAREHOUSES[wh][0], "dock": WAREHOUSES[wh][1], "status": "scheduled"}
""",
)
tool(
    I,
    "transfer_stock",
    "Move units of a SKU from one warehouse to another.",
    [
        ("sku", "string", "Product SKU"),
        ("from_warehouse", "string", "Source warehouse id"),
        ("to_warehouse", "string", "Destination warehouse id"),
        ("quantity", "integer", "Units to move"),
    ],
    consts={"PRODUCTS": PRODUCTS},
    helpers=(HASH_SRC,),
    code="""
def transfer_stock(sku, from_warehouse, to_warehouse, quantity):
    key = str(sku).strip().upper()
    p = PRODUCTS.get(key)
    if p is None:
        return {"error": "unknown sku " + str(sku)}
    a, b = str(from_warehouse).strip().upper(), str(to_warehouse).strip().upper()
    if a not in p[2] or b not in p[2] or a == b:
        return {"error": "invalid warehouse pair " + a + " -> " + b}
    try:
        q = int(quantity)
    except (TypeError, ValueError):
        return {"error": "quantity must be an integer"}
    if not 0 < q <= p[2][a]:
        return {"error": "cannot move %s units: %s has %d on hand" % (quantity, a, p[2][a])}
    return {"transfer_id": _h("TRF", key, a, b, q), "sku": key, "quantity": q,
            "from_on_hand_after": p[2][a] - q, "to_on_hand_after": p[2][b] + q,
            "status": "in transit"}
""",
)
tool(
    I,
    "get_sales_report",
    "Units sold and revenue of a SKU in a month.",
    [("sku", "string", "Product SKU"), ("month", "string", "Month, YYYY-MM")],
    consts={"SALES": {"SKU-30118": 212, "SKU-41207": 57, "SKU-63310": 344}},
    code="""
def get_sales_report(sku, month):
    key = str(sku).strip().upper()
    if key not in SALES:
        return {"error": "no sales data for " + str(sku)}
    return {"sku": key, "month": str(month), "units_sold": SALES[key]}
""",
)
tool(
    I,
    "list_warehouses",
    "List all warehouses with their city.",
    [],
    consts={"WAREHOUSES": WAREHOUSES},
    code="""
def list_warehouses():
    return {"warehouses": [{"warehouse_id": k, "city": v[0]} for k, v in WAREHOUSES.items()]}
""",
)
tool(
    I,
    "update_product_price",
    "Change the list price of a SKU.",
    [("sku", "string", "Product SKU"), ("new_price", "number", "New list price, USD")],
    consts={"SKUS": sorted(PRODUCTS)},
    code="""
def update_product_price(sku, new_price):
    key = str(sku).strip().upper()
    if key not in SKUS:
        return {"error": "unknown sku " + str(sku)}
    try:
        price = float(new_price)
    except (TypeError, ValueError):
        return {"error": "new_price must be a number"}
    return {"sku": key, "list_price": "%.2f" % price, "status": "updated"}
""",
)

po3 = H("PO", "VA-60288", "SKU-52044", 40)
po4 = H("PO", "VA-93015", "SKU-63310", 150)
po6 = H("PO", "VA-77310", "SKU-30155", 200)
task(
    I,
    "Quick stock question before our promo: how many units of the Aurora Bluetooth "
    "Headset do we have on hand in total, across all warehouses?",
    [
        ("find_product", {"query": "Aurora Bluetooth Headset"}, "SKU-30118"),
        ("get_stock_levels", {"sku": "SKU-30118"}, "167"),
    ],
    ["get_sales_report", "list_warehouses"],
)
task(
    I,
    "I need to chase the supplier of the Granite 32in Curved Monitor. Find which supplier "
    "is its primary supplier and give me their order email address and lead time.",
    [
        ("find_product", {"query": "Granite 32in Curved Monitor"}, "SKU-41290"),
        ("get_stock_levels", {"sku": "SKU-41290"}, "SUP-305"),
        ("get_supplier", {"supplier_id": "SUP-305"}, "sales@lumenpanel.example"),
    ],
    ["create_purchase_order", "update_product_price"],
)
task(
    I,
    "We're short on the Tern Ergonomic Chair. Raise a purchase order for 40 units with "
    "its primary supplier (POs need the supplier's vendor account) and report the PO "
    "number and the order total.",
    [
        ("find_product", {"query": "Tern Ergonomic Chair"}, "SKU-52044"),
        ("get_stock_levels", {"sku": "SKU-52044"}, "SUP-412"),
        ("get_supplier", {"supplier_id": "SUP-412"}, "VA-60288"),
        (
            "create_purchase_order",
            {"vendor_account": "VA-60288", "sku": "SKU-52044", "quantity": 40},
            [po3, "8590.00"],
        ),
    ],
    ["transfer_stock", "schedule_delivery"],
)
task(
    I,
    "Restock the Pulse USB-C Dock: order 150 units from its primary supplier, then "
    "schedule the delivery to whichever warehouse currently has the fewest units of it "
    "on hand. Give me the PO number and the delivery id.",
    [
        ("find_product", {"query": "Pulse USB-C Dock"}, "SKU-63310"),
        ("get_stock_levels", {"sku": "SKU-63310"}, "SUP-527"),
        ("get_supplier", {"supplier_id": "SUP-527"}, "VA-93015"),
        (
            "create_purchase_order",
            {"vendor_account": "VA-93015", "sku": "SKU-63310", "quantity": 150},
            [po4, "9585.00"],
        ),
        (
            "schedule_delivery",
            {"po_number": po4, "warehouse_id": "WH-SOUTH"},
            H("DLV", po4, "WH-SOUTH"),
        ),
    ],
    ["transfer_stock", "list_warehouses"],
)
task(
    I,
    "Rebalance the Granite 27in Monitor: move 20 units from the warehouse holding the "
    "most of them to the warehouse holding the fewest. What's the transfer id?",
    [
        ("find_product", {"query": "Granite 27in Monitor"}, "SKU-41207"),
        ("get_stock_levels", {"sku": "SKU-41207"}, "SUP-305"),
        (
            "transfer_stock",
            {
                "sku": "SKU-41207",
                "from_warehouse": "WH-EAST",
                "to_warehouse": "WH-SOUTH",
                "quantity": 20,
            },
            H("TRF", "SKU-41207", "WH-EAST", "WH-SOUTH", 20),
        ),
    ],
    ["create_purchase_order", "get_sales_report"],
)
task(
    I,
    "Place an order for 200 units of the Aurora Wired Headset with its primary supplier "
    "(you'll need the supplier's vendor account). What's the PO number and total cost?",
    [
        ("find_product", {"query": "Aurora Wired Headset"}, "SKU-30155"),
        ("get_stock_levels", {"sku": "SKU-30155"}, "SUP-218"),
        ("get_supplier", {"supplier_id": "SUP-218"}, "VA-77310"),
        (
            "create_purchase_order",
            {"vendor_account": "VA-77310", "sku": "SKU-30155", "quantity": 200},
            [po6, "2350.00"],
        ),
    ],
    ["schedule_delivery", "update_product_price", "list_warehouses"],
)

# =========================================================================== banking
ACCOUNTS = {  # id: [owner, type, last4, available balance in cents]
    "ACC-30417": ["Marta Kowalski", "checking", "4417", 231055],
    "ACC-30452": ["Marta Kowalski", "savings", "9052", 1284000],
    "ACC-51880": ["Jonah Feld", "checking", "1880", 87420],
    "ACC-51893": ["Jonah Feld", "savings", "7393", 412090],
    "ACC-62209": ["Priya Natarajan", "checking", "2209", 560312],
    "ACC-73341": ["Luis Ortega", "checking", "3341", 129900],
    "ACC-73368": ["Luis Ortega", "savings", "3368", 2250075],
}
TXNS = {  # id: [account, date, merchant, cents, auth code, merchant category code]
    "TX-90311": ["ACC-30417", "2025-03-02", "Greenleaf Grocers", 8412, "AUTH-3KD81Q", "5411"],
    "TX-90347": ["ACC-30417", "2025-03-09", "Skyline Airways", 64900, "AUTH-7PX20M", "4511"],
    "TX-90388": ["ACC-30417", "2025-03-15", "Metro Fuel", 5230, "AUTH-1ZQ67C", "5541"],
    "TX-90402": ["ACC-30417", "2025-03-21", "Streamly Subscription", 1599, "AUTH-8WN45R", "4899"],
    "TX-90419": ["ACC-30417", "2025-03-21", "Streamly Subscription", 1599, "AUTH-8WN46T", "4899"],
    "TX-90533": ["ACC-30417", "2025-04-03", "Greenleaf Grocers", 7710, "AUTH-2LC09V", "5411"],
    "TX-91105": ["ACC-51880", "2025-03-04", "Corner Bakery", 1275, "AUTH-2HB90E", "5812"],
    "TX-91162": ["ACC-51880", "2025-03-11", "VoltMart Electronics", 129999, "AUTH-6TR33J", "5732"],
    "TX-91170": ["ACC-51880", "2025-03-18", "City Parking", 2400, "AUTH-4MM18K", "7523"],
    "TX-92031": ["ACC-62209", "2025-03-05", "Harbor Hotel", 41800, "AUTH-5GX72L", "7011"],
    "TX-92066": ["ACC-62209", "2025-03-12", "Quill Office Supply", 8955, "AUTH-9QP04D", "5943"],
    "TX-92090": ["ACC-62209", "2025-03-27", "Nimbus Furniture", 187650, "AUTH-3VC58S", "5712"],
    "TX-92118": ["ACC-62209", "2025-04-02", "Nimbus Furniture", 24900, "AUTH-3VC77A", "5712"],
    "TX-93012": ["ACC-73341", "2025-03-08", "Riverside Pharmacy", 2318, "AUTH-6YF21N", "5912"],
    "TX-93044": ["ACC-73341", "2025-03-19", "Atlas Gym", 4900, "AUTH-0RD52B", "7997"],
}
REASONS = ["unrecognized", "duplicate", "not_received", "wrong_amount"]
K = "banking"
tool(
    K,
    "find_account",
    "List a customer's bank accounts (ids, types, last four digits).",
    [("customer_name", "string", "Customer's full name")],
    consts={"ACCOUNTS": ACCOUNTS},
    code="""
def find_account(customer_name):
    who = " ".join(str(customer_name).split()).lower()
    rows = [{"account_id": k, "type": v[1], "last4": v[2]} for k, v in ACCOUNTS.items()
            if v[0].lower() == who]
    if not rows:
        return {"error": "no customer named " + str(customer_name)}
    return {"customer": str(customer_name).strip(), "accounts": rows}
""",
)
tool(
    K,
    "get_balance",
    "Available balance of an account.",
    [("account_id", "string", "Account id, e.g. 'ACC-00000'")],
    consts={"ACCOUNTS": ACCOUNTS},
    helpers=(MONEY_SRC,),
    code="""
def get_balance(account_id):
    key = str(account_id).strip().upper()
    a = ACCOUNTS.get(key)
    if a is None:
        return {"error": "unknown account " + str(account_id)}
    return {"account_id": key, "type": a[1], "available_balance": _m(a[3]), "currency": "USD"}
""",
)
tool(
    K,
    "list_transactions",
    "Card transactions on an account in one month.",
    [("account_id", "string", "Account id"), ("month", "string", "Month, YYYY-MM")],
    consts={"ACCOUNTS": ACCOUNTS, "TXNS": TXNS},
    helpers=(MONEY_SRC,),
    code="""
def list_transactions(account_id, month):
    key = str(account_id).strip().upper()
    if key not in ACCOUNTS:
        return {"error": "unknown account " + str(account_id)}
    m = str(month).strip()
    rows = [{"txn_id": t, "date": v[1], "merchant": v[2], "amount": _m(v[3])}
            for t, v in TXNS.items() if v[0] == key and v[1].startswith(m + "-")]
    return {"account_id": key, "month": m, "currency": "USD", "transactions": rows}
""",
)
tool(
    K,
    "get_transaction_details",
    "Full record of one transaction, including its authorization code and merchant category code.",
    [("txn_id", "string", "Transaction id, e.g. 'TX-00000'")],
    consts={"TXNS": TXNS},
    helpers=(MONEY_SRC,),
    code="""
def get_transaction_details(txn_id):
    key = str(txn_id).strip().upper()
    v = TXNS.get(key)
    if v is None:
        return {"error": "unknown transaction " + str(txn_id)}
    return {"txn_id": key, "account_id": v[0], "date": v[1], "merchant": v[2],
            "amount": _m(v[3]), "currency": "USD", "auth_code": v[4],
            "merchant_category_code": v[5], "status": "posted"}
""",
)
tool(
    K,
    "dispute_transaction",
    "Open a dispute on a card transaction. Requires the transaction's authorization code.",
    [
        ("txn_id", "string", "Transaction id"),
        ("auth_code", "string", "Authorization code from get_transaction_details"),
        ("reason", "string", "Dispute reason", REASONS),
    ],
    consts={"TXNS": TXNS, "REASONS": REASONS},
    helpers=(HASH_SRC,),
    code="""
def dispute_transaction(txn_id, auth_code, reason):
    key = str(txn_id).strip().upper()
    v = TXNS.get(key)
    if v is None:
        return {"error": "unknown transaction " + str(txn_id)}
    if str(auth_code).strip().upper() != v[4]:
        return {"error": "authorization code does not match transaction " + key}
    r = str(reason).strip().lower()
    if r not in REASONS:
        return {"error": "reason must be one of " + ", ".join(REASONS)}
    return {"case_id": _h("DSP", key, r), "txn_id": key, "reason": r, "status": "opened"}
""",
)
tool(
    K,
    "get_dispute_status",
    "Current status of a dispute case.",
    [("case_id", "string", "Dispute case id, e.g. 'DSP-000000'")],
    helpers=(HASH_SRC,),
    code="""
def get_dispute_status(case_id):
    import re
    c = str(case_id).strip().upper()
    if not re.fullmatch(r"DSP-[0-9A-F]{6}", c):
        return {"error": "unknown dispute case " + str(case_id)}
    return {"case_id": c, "status": "provisional credit issued",
            "credit_reference": _h("PCR", c), "decision_due_days": 10}
""",
)
tool(
    K,
    "transfer_funds",
    "Move money between two accounts.",
    [
        ("from_account_id", "string", "Account to debit"),
        ("to_account_id", "string", "Account to credit"),
        ("amount", "number", "Amount in USD"),
    ],
    consts={"ACCOUNTS": ACCOUNTS},
    helpers=(HASH_SRC, MONEY_SRC),
    code="""
def transfer_funds(from_account_id, to_account_id, amount):
    a, b = str(from_account_id).strip().upper(), str(to_account_id).strip().upper()
    if a not in ACCOUNTS or b not in ACCOUNTS or a == b:
        return {"error": "invalid account pair " + a + " -> " + b}
    try:
        cents = int(round(float(amount) * 100))
    except (TypeError, ValueError):
        return {"error": "amount must be a number"}
    if not 0 < cents <= ACCOUNTS[a][3]:
        return {"error": "insufficient funds or invalid amount"}
    return {"transfer_id": _h("TRF", a, b, cents), "amount": _m(cents), "currency": "USD",
            "from_balance_after": _m(ACCOUNTS[a][3] - cents), "status": "completed"}
""",
)
tool(
    K,
    "get_exchange_rate",
    "Reference exchange rate between two currencies.",
    [("base", "string", "ISO code"), ("quote", "string", "ISO code")],
    consts={"FX": {"USD/EUR": "0.9260", "USD/GBP": "0.7890", "EUR/USD": "1.0800"}},
    code="""
def get_exchange_rate(base, quote):
    pair = str(base).strip().upper() + "/" + str(quote).strip().upper()
    if pair not in FX:
        return {"error": "no rate for " + pair}
    return {"pair": pair, "rate": FX[pair]}
""",
)
tool(
    K,
    "get_loan_offers",
    "Pre-approved loan offers for a customer.",
    [("customer_name", "string", "Customer's full name")],
    consts={
        "OFFERS": {
            "marta kowalski": ["personal", "15000.00", "7.9"],
            "luis ortega": ["auto", "28000.00", "5.4"],
        }
    },
    code="""
def get_loan_offers(customer_name):
    o = OFFERS.get(" ".join(str(customer_name).split()).lower())
    if o is None:
        return {"offers": []}
    return {"offers": [{"kind": o[0], "max_amount": o[1], "apr_pct": o[2]}]}
""",
)
tool(
    K,
    "freeze_card",
    "Temporarily freeze the debit card linked to an account.",
    [("account_id", "string", "Account id")],
    consts={"ACCTS": sorted(ACCOUNTS)},
    code="""
def freeze_card(account_id):
    key = str(account_id).strip().upper()
    if key not in ACCTS:
        return {"error": "unknown account " + str(account_id)}
    return {"account_id": key, "card_status": "frozen"}
""",
)

d3 = H("DSP", "TX-91162", "unrecognized")
d4 = H("DSP", "TX-90419", "duplicate")
d6 = H("DSP", "TX-92090", "not_received")
task(
    K,
    "Jonah Feld is asking how much he has in his savings account. Look it up and tell me "
    "the available balance.",
    [
        ("find_account", {"customer_name": "Jonah Feld"}, "ACC-51893"),
        ("get_balance", {"account_id": "ACC-51893"}, "4120.90"),
    ],
    ["transfer_funds", "get_loan_offers"],
)
task(
    K,
    "Marta Kowalski wants to verify the largest charge on her checking account in March "
    "2025 with the merchant. Find that transaction and give me its authorization code.",
    [
        ("find_account", {"customer_name": "Marta Kowalski"}, "ACC-30417"),
        ("list_transactions", {"account_id": "ACC-30417", "month": "2025-03"}, "TX-90347"),
        ("get_transaction_details", {"txn_id": "TX-90347"}, "AUTH-7PX20M"),
    ],
    ["get_exchange_rate", "freeze_card"],
)
task(
    K,
    "Jonah Feld says he never made the VoltMart Electronics purchase on his checking "
    "account in March 2025. Open a dispute on it with reason 'unrecognized' and tell me "
    "the case id.",
    [
        ("find_account", {"customer_name": "Jonah Feld"}, "ACC-51880"),
        ("list_transactions", {"account_id": "ACC-51880", "month": "2025-03"}, "TX-91162"),
        ("get_transaction_details", {"txn_id": "TX-91162"}, "AUTH-6TR33J"),
        (
            "dispute_transaction",
            {"txn_id": "TX-91162", "auth_code": "AUTH-6TR33J", "reason": "unrecognized"},
            d3,
        ),
    ],
    ["freeze_card", "get_balance"],
)
task(
    K,
    "Marta Kowalski was billed twice by Streamly Subscription on the same day in March "
    "2025 (checking account). Dispute the second of the two charges (the one with the "
    "later transaction id) as a duplicate, then check the dispute's status and give me "
    "the credit reference.",
    [
        ("find_account", {"customer_name": "Marta Kowalski"}, "ACC-30417"),
        ("list_transactions", {"account_id": "ACC-30417", "month": "2025-03"}, "TX-90419"),
        ("get_transaction_details", {"txn_id": "TX-90419"}, "AUTH-8WN46T"),
        (
            "dispute_transaction",
            {"txn_id": "TX-90419", "auth_code": "AUTH-8WN46T", "reason": "duplicate"},
            d4,
        ),
        ("get_dispute_status", {"case_id": d4}, H("PCR", d4)),
    ],
    ["get_balance"],
)
task(
    K,
    "Luis Ortega wants to move 750.00 USD from his savings account into his checking "
    "account. First tell me his current savings balance, then make the transfer and give "
    "me the transfer id.",
    [
        ("find_account", {"customer_name": "Luis Ortega"}, "ACC-73368"),
        ("get_balance", {"account_id": "ACC-73368"}, "22500.75"),
        (
            "transfer_funds",
            {"from_account_id": "ACC-73368", "to_account_id": "ACC-73341", "amount": 750.00},
            H("TRF", "ACC-73368", "ACC-73341", 75000),
        ),
    ],
    ["get_loan_offers", "get_exchange_rate"],
)
task(
    K,
    "Priya Natarajan says the biggest purchase on her checking account in March 2025 was "
    "never delivered. Open a dispute on it with reason 'not_received' and tell me the "
    "case id.",
    [
        ("find_account", {"customer_name": "Priya Natarajan"}, "ACC-62209"),
        ("list_transactions", {"account_id": "ACC-62209", "month": "2025-03"}, "TX-92090"),
        ("get_transaction_details", {"txn_id": "TX-92090"}, "AUTH-3VC58S"),
        (
            "dispute_transaction",
            {"txn_id": "TX-92090", "auth_code": "AUTH-3VC58S", "reason": "not_received"},
            d6,
        ),
    ],
    ["get_dispute_status", "freeze_card", "transfer_funds"],
)

# =========================================================================== weather
LOCS = {  # lower-case city: [location id, display name, lat, lon, time zone]
    "bergen": ["LOC-60391", "Bergen, Norway", "60.39", "5.32", "Europe/Oslo"],
    "denver": ["LOC-39740", "Denver, USA", "39.74", "-104.99", "America/Denver"],
    "darwin": ["LOC-12462", "Darwin, Australia", "-12.46", "130.84", "Australia/Darwin"],
    "valencia": ["LOC-39470", "Valencia, Spain", "39.47", "-0.38", "Europe/Madrid"],
    "galway": ["LOC-53270", "Galway, Ireland", "53.27", "-9.05", "Europe/Dublin"],
    "kochi": ["LOC-09931", "Kochi, India", "9.93", "76.26", "Asia/Kolkata"],
}
FORECASTS = {  # location: {date: [condition, high, low, precip mm, wind kph]}
    "LOC-60391": {"2025-04-17": ["overcast", "8.4", "3.9", "2.1", "22"],
                  "2025-04-18": ["heavy rain", "9.1", "4.3", "14.2", "38"]},
    "LOC-39740": {"2025-01-11": ["clear and cold", "-2.0", "-13.5", "0.0", "31"]},
    "LOC-12462": {"2025-02-14": ["tropical cyclone", "29.8", "25.1", "212.6", "145"]},
    "LOC-39470": {"2025-10-29": ["torrential rain", "21.4", "16.2", "96.3", "47"]},
    "LOC-53270": {"2025-11-03": ["gale-force showers", "9.5", "6.0", "11.8", "71"],
                  "2025-11-04": ["bright spells", "10.2", "5.1", "0.7", "29"]},
    "LOC-09931": {"2025-06-23": ["monsoon downpours", "28.6", "24.0", "118.4", "42"]},
}
STATIONS = {"LOC-60391": ["ST-BGO-07", "Bergen Florida", "1.2"],
            "LOC-39740": ["ST-DEN-14", "Denver Intl Airport", "18.6"],
            "LOC-12462": ["ST-DRW-02", "Darwin Airport", "6.4"],
            "LOC-39470": ["ST-VLC-11", "Valencia Viveros", "2.3"],
            "LOC-53270": ["ST-GWY-05", "Mace Head", "29.0"],
            "LOC-09931": ["ST-COK-03", "Kochi Naval Air Station", "4.8"]}
OBS = {  # station: {date: [temp C, gust kph, humidity %, pressure hPa]}
    "ST-DEN-14": {"2025-01-11": ["-8.4", "87.5", "54", "1021.7"]},
    "ST-BGO-07": {"2025-04-18": ["7.6", "61.2", "97", "991.3"]},
    "ST-GWY-05": {"2025-11-03": ["8.9", "104.6", "88", "978.2"]},
    "ST-COK-03": {"2025-06-23": ["26.1", "55.0", "96", "1002.4"]},
}
ALERTS = {
    "LOC-12462": [["AL-5521", "tropical cyclone warning", "extreme"],
                  ["AL-5508", "heat advisory", "moderate"]],
    "LOC-39470": [["AL-6130", "flash flood warning", "severe"]],
    "LOC-09931": [["AL-7702", "heavy rainfall warning", "severe"],
                  ["AL-7690", "coastal wind advisory", "minor"]],
    "LOC-60391": [["AL-4410", "wind advisory", "minor"]],
}
ALERT_INFO = {  # alert: [headline, expires, zone]
    "AL-5521": ["Cyclone Kirra expected to cross the coast near Darwin", "2025-02-15T06:00",
                "ZN-NT-214"],
    "AL-5508": ["Heatwave conditions for the Top End", "2025-02-17T18:00", "ZN-NT-200"],
    "AL-6130": ["Flash flooding likely along the Turia and Poyo ravines", "2025-10-30T09:00",
                "ZN-VLC-031"],
    "AL-7702": ["Extremely heavy rainfall over Ernakulam district", "2025-06-24T20:30",
                "ZN-KL-118"],
    "AL-7690": ["Squally winds along the Kerala coast", "2025-06-24T08:00", "ZN-KL-102"],
    "AL-4410": ["Strong south-westerly winds in Vestland", "2025-04-18T21:00", "ZN-VL-006"],
}
CENTERS = {  # zone: [[center id, name, capacity, occupied]]
    "ZN-NT-214": [["EC-2140", "Casuarina Secondary College", 650, 402],
                  ["EC-2147", "Darwin Convention Centre", 1200, 933],
                  ["EC-2152", "Palmerston Recreation Hall", 380, 377]],
    "ZN-NT-200": [["EC-2001", "Nightcliff Community Hall", 240, 31]],
    "ZN-VLC-031": [["EC-3101", "Pabellón Fuente de San Luis", 900, 512],
                   ["EC-3108", "Colegio Público Benimaclet", 420, 96]],
    "ZN-KL-118": [["EC-1181", "Ernakulam Town Hall", 750, 610],
                  ["EC-1186", "St. Teresa's School Hall", 520, 140],
                  ["EC-1190", "Kaloor Indoor Stadium", 1500, 1187]],
    "ZN-KL-102": [["EC-1020", "Fort Kochi Parish Hall", 300, 12]],
    "ZN-VL-006": [],
}
W = "weather"
tool(W, "geocode_city", "Resolve a city name to a location id and coordinates.",
     [("city", "string", "City name, e.g. 'Bergen'")], consts={"LOCS": LOCS}, code='''
def geocode_city(city):
    key = str(city).split(",")[0].strip().lower()
    v = LOCS.get(key)
    if v is None:
        return {"error": "unknown city " + str(city)}
    return {"location_id": v[0], "name": v[1], "lat": v[2], "lon": v[3], "timezone": v[4]}
''')
tool(W, "get_forecast", "Daily forecast for a location on a date.",
     [("location_id", "string", "Location id from geocode_city, e.g. 'LOC-00000'"),
      ("date", "string", "Date, YYYY-MM-DD")], consts={"FORECASTS": FORECASTS}, code='''
def get_forecast(location_id, date):
    key = str(location_id).strip().upper()
    if key not in FORECASTS:
        return {"error": "unknown location " + str(location_id)}
    f = FORECASTS[key].get(str(date).strip())
    if f is None:
        return {"error": "no forecast for " + key + " on " + str(date)}
    return {"location_id": key, "date": str(date).strip(), "condition": f[0], "high_c": f[1],
            "low_c": f[2], "precip_mm": f[3], "wind_kph": f[4]}
''')
tool(W, "get_nearest_station", "Nearest weather observation station to a location.",
     [("location_id", "string", "Location id")], consts={"STATIONS": STATIONS}, code='''
def get_nearest_station(location_id):
    key = str(location_id).strip().upper()
    s = STATIONS.get(key)
    if s is None:
        return {"error": "unknown location " + str(location_id)}
    return {"location_id": key, "station_id": s[0], "name": s[1], "distance_km": s[2]}
''')
tool(W, "get_station_observations",
     "Observed daily extremes at a station: temperature, peak gust, humidity, pressure.",
     [("station_id", "string", "Station id, e.g. 'ST-XXX-00'"),
      ("date", "string", "Date, YYYY-MM-DD")], consts={"OBS": OBS}, code='''
def get_station_observations(station_id, date):
    key = str(station_id).strip().upper()
    if key not in OBS:
        return {"error": "no observations for station " + str(station_id)}
    o = OBS[key].get(str(date).strip())
    if o is None:
        return {"error": "no observations at " + key + " on " + str(date)}
    return {"station_id": key, "date": str(date).strip(), "temp_c": o[0], "peak_gust_kph": o[1],
            "humidity_pct": o[2], "pressure_hpa": o[3]}
''')
tool(W, "get_weather_alerts", "Active weather alerts for a location.",
     [("location_id", "string", "Location id")],
     consts={"ALERTS": ALERTS, "KNOWN": sorted(STATIONS)}, code='''
def get_weather_alerts(location_id):
    key = str(location_id).strip().upper()
    if key not in KNOWN:
        return {"error": "unknown location " + str(location_id)}
    return {"location_id": key, "alerts": [{"alert_id": a, "event": e, "severity": s}
                                           for a, e, s in ALERTS.get(key, [])]}
''')
tool(W, "get_alert_details", "Headline, expiry and affected emergency zone of an alert.",
     [("alert_id", "string", "Alert id, e.g. 'AL-0000'")], consts={"ALERT_INFO": ALERT_INFO},
     code='''
def get_alert_details(alert_id):
    key = str(alert_id).strip().upper()
    a = ALERT_INFO.get(key)
    if a is None:
        return {"error": "unknown alert " + str(alert_id)}
    return {"alert_id": key, "headline": a[0], "expires": a[1], "zone_id": a[2]}
''')
tool(W, "get_evacuation_centers", "Evacuation centers designated for an emergency zone.",
     [("zone_id", "string", "Emergency zone id, e.g. 'ZN-XX-000'")],
     consts={"CENTERS": CENTERS}, code='''
def get_evacuation_centers(zone_id):
    key = str(zone_id).strip().upper()
    if key not in CENTERS:
        return {"error": "unknown zone " + str(zone_id)}
    return {"zone_id": key, "centers": [{"center_id": c, "name": n, "capacity": cap}
                                        for c, n, cap, _ in CENTERS[key]]}
''')
tool(W, "get_center_status",
     "Live status of an evacuation center: occupancy, open beds and the intake code "
     "evacuees give on arrival.",
     [("center_id", "string", "Center id, e.g. 'EC-0000'")],
     consts={"CENTERS": CENTERS}, helpers=(HASH_SRC,), code='''
def get_center_status(center_id):
    key = str(center_id).strip().upper()
    for rows in CENTERS.values():
        for c, n, cap, occ in rows:
            if c == key:
                return {"center_id": c, "name": n, "status": "open", "occupied": occ,
                        "open_beds": cap - occ, "intake_code": _h("INT", c)}
    return {"error": "unknown center " + str(center_id)}
''')
tool(W, "convert_temperature", "Convert a temperature between C, F and K.",
     [("value", "number", "Temperature"), ("from_unit", "string", "C, F or K", ["C", "F", "K"]),
      ("to_unit", "string", "C, F or K", ["C", "F", "K"])], code='''
def convert_temperature(value, from_unit, to_unit):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return {"error": "value must be a number"}
    a, b = str(from_unit).upper(), str(to_unit).upper()
    to_c = {"C": lambda x: x, "F": lambda x: (x - 32) * 5 / 9, "K": lambda x: x - 273.15}
    from_c = {"C": lambda x: x, "F": lambda x: x * 9 / 5 + 32, "K": lambda x: x + 273.15}
    if a not in to_c or b not in from_c:
        return {"error": "units must be C, F or K"}
    return {"value": "%.1f" % from_c[b](to_c[a](v)), "unit": b}
''')
tool(W, "get_sunrise_sunset", "Sunrise and sunset times for a location and date.",
     [("location_id", "string", "Location id"), ("date", "string", "Date, YYYY-MM-DD")],
     consts={"SUN": {"LOC-60391": ["06:12", "21:04"], "LOC-53270": ["07:41", "17:02"],
                     "LOC-12462": ["06:48", "19:12"]}}, code='''
def get_sunrise_sunset(location_id, date):
    s = SUN.get(str(location_id).strip().upper())
    if s is None:
        return {"error": "no almanac data for " + str(location_id)}
    return {"date": str(date), "sunrise": s[0], "sunset": s[1]}
''')
tool(W, "get_historical_average", "Long-term monthly climate averages for a city.",
     [("city", "string", "City name"), ("month", "integer", "Month number 1-12")],
     consts={"CLIMATE": {"bergen": "7.9", "galway": "8.6", "denver": "-0.4", "kochi": "27.4"}},
     code='''
def get_historical_average(city, month):
    t = CLIMATE.get(str(city).strip().lower())
    if t is None:
        return {"error": "no climate normals for " + str(city)}
    return {"city": str(city), "month": month, "mean_temp_c": t}
''')

task(W, "I'm hiking near Bergen on 2025-04-18 and need to know how wet it will be. How much "
        "precipitation (mm) is forecast for Bergen that day?",
     [("geocode_city", {"city": "Bergen"}, "LOC-60391"),
      ("get_forecast", {"location_id": "LOC-60391", "date": "2025-04-18"}, "14.2")],
     ["get_historical_average", "get_nearest_station"])
task(W, "For an insurance claim about a fallen tree in Denver, I need the observed peak wind "
        "gust on 2025-01-11 at the weather station nearest to Denver. Find the station and "
        "report the gust.",
     [("geocode_city", {"city": "Denver"}, "LOC-39740"),
      ("get_nearest_station", {"location_id": "LOC-39740"}, "ST-DEN-14"),
      ("get_station_observations", {"station_id": "ST-DEN-14", "date": "2025-01-11"},
       "87.5")],
     ["get_forecast", "convert_temperature"])
task(W, "Darwin has an active tropical cyclone warning. Look up the warning, find the emergency "
        "zone it covers, and tell me which evacuation center in that zone has the largest "
        "capacity.",
     [("geocode_city", {"city": "Darwin"}, "LOC-12462"),
      ("get_weather_alerts", {"location_id": "LOC-12462"}, "AL-5521"),
      ("get_alert_details", {"alert_id": "AL-5521"}, "ZN-NT-214"),
      ("get_evacuation_centers", {"zone_id": "ZN-NT-214"}, "EC-2147")],
     ["get_center_status", "get_sunrise_sunset"])
task(W, "Valencia is under a flash flood warning. Using the warning's emergency zone, pick the "
        "evacuation center with the largest capacity and get its live status: I need the "
        "intake code and the number of open beds.",
     [("geocode_city", {"city": "Valencia"}, "LOC-39470"),
      ("get_weather_alerts", {"location_id": "LOC-39470"}, "AL-6130"),
      ("get_alert_details", {"alert_id": "AL-6130"}, "ZN-VLC-031"),
      ("get_evacuation_centers", {"zone_id": "ZN-VLC-031"}, "EC-3101"),
      ("get_center_status", {"center_id": "EC-3101"}, H("INT", "EC-3101"))],
     ["get_forecast"])
task(W, "Ferry operators in Galway want a one-line summary of the weather forecast for "
        "2025-11-03. What condition is forecast for Galway that day?",
     [("geocode_city", {"city": "Galway"}, "LOC-53270"),
      ("get_forecast", {"location_id": "LOC-53270", "date": "2025-11-03"},
       "gale-force showers")],
     ["get_station_observations", "get_sunrise_sunset"])
task(W, "Kochi has several weather alerts. Take the severe heavy-rainfall warning, find its "
        "emergency zone, choose the evacuation center there with the largest capacity, and "
        "get that center's live status. Report the intake code.",
     [("geocode_city", {"city": "Kochi"}, "LOC-09931"),
      ("get_weather_alerts", {"location_id": "LOC-09931"}, "AL-7702"),
      ("get_alert_details", {"alert_id": "AL-7702"}, "ZN-KL-118"),
      ("get_evacuation_centers", {"zone_id": "ZN-KL-118"}, "EC-1190"),
      ("get_center_status", {"center_id": "EC-1190"}, H("INT", "EC-1190"))],
     ["get_historical_average", "convert_temperature"])

# =========================================================================== files
FILES = {  # id: [path, size bytes, owner, modified, sha256]
    "F-3C91": ["/finance/2024/budget_2024.xlsx", 482113, "U-207", "2025-02-11T09:14",
               "9f2c41d0ab7e5c3318e0d7a64b21f90c55d1e8a3b6c7f4029d8e1a5b3c7d9e0f"],
    "F-9A61": ["/finance/2023/budget_2023.xlsx", 455020, "U-207", "2024-02-02T16:40",
               "1b7d33e0c9a24f6b8e51d0c7a3f92e46b5d8c1e07a9f3b26d4e8c5a1f0b7d392"],
    "F-4A07": ["/ops/runbooks/deploy.md", 6120, "U-142", "2025-03-04T11:20",
               "c04e7a19d2b85f3e6a1c9d07b4e2f85a3c6d9e10b7a4f2c58e1d3b6a9c0f7e24"],
    "F-5B12": ["/team/notes/handover.txt", 812, "U-207", "2025-03-28T18:05",
               "5e8a2c71f0b3d94e6c1a7b58d2e0f93c4a6b1d8e7f2c05a93b6d4e1c8a7f0b25"],
    "F-8D20": ["/finance/q3/q3_numbers.xlsx", 220947, "U-311", "2025-03-27T10:31",
               "e71c4b9a0d35f82c6e4a1b97d0c3f58e2a6d9b14c7e0f3a85d2b6c9e1a4f7d03"],
    "F-6E44": ["/legal/templates/nda_template.docx", 58233, "U-188", "2025-01-20T08:30",
               "a3d6f91c4e07b82d5c1e9a64f0b3d7c28e5a1f96d4c0b7e32a8f5d1c9e6b04a7"],
    "F-7F58": ["/design/brand/logo_final.svg", 14870, "U-265", "2025-03-18T17:02",
               "70bd2e5c8a41f9d3e6c0b7a25d8f14e9c3a6b0d72e5f8c1a94d7b3e6f0c2a58d"],
    "F-2D33": ["/ops/config/app.yaml", 1904, "U-142", "2025-03-30T07:45",
               "d9c2a7e41b6f08d3c5e9a2b74f1d6c08e3a5b9f27d4c1e06a8b3f5d92c7e4a10"],
}
CONTENTS = {
    "F-5B12": "Handover, week 13.\nBudget review moved to Thursday.\nThe final Q3 figures live "
              "in file F-8D20 (q3_numbers.xlsx); check with its owner before editing.\n",
    "F-4A07": "# Deploy runbook\n1. Freeze merges.\n2. Run the canary for 30 minutes.\n",
    "F-2D33": "service: billing-api\nreplicas: 4\nlog_level: info\n",
}
USERS = {  # id: [name, email, team]
    "U-207": ["Irene Salo", "irene.salo@northwind.example", "Finance"],
    "U-311": ["Kwame Osei", "kwame.osei@northwind.example", "Finance"],
    "U-188": ["Beatriz Lima", "beatriz.lima@northwind.example", "Legal"],
    "U-265": ["Noah Brandt", "noah.brandt@northwind.example", "Design"],
    "U-199": ["Omar Haddad", "omar.haddad@northwind.example", "Design"],
    "U-142": ["Sofia Marin", "sofia.marin@northwind.example", "Platform"],
    "U-233": ["Lena Vogt", "lena.vogt@northwind.example", "Legal"],
}
VERSIONS = {  # file: [[version id, saved at, author]], newest first
    "F-7F58": [["V-1187", "2025-03-18T17:02", "U-265"], ["V-1142", "2025-03-11T10:45", "U-199"],
               ["V-1090", "2025-02-26T09:12", "U-265"], ["V-1013", "2025-01-30T15:38", "U-199"]],
    "F-6E44": [["V-2290", "2025-01-20T08:30", "U-188"], ["V-2216", "2024-11-05T14:12", "U-188"],
               ["V-2141", "2024-06-19T11:00", "U-233"]],
    "F-2D33": [["V-3375", "2025-03-30T07:45", "U-142"], ["V-3352", "2025-03-12T13:20", "U-142"],
               ["V-3318", "2025-01-27T16:55", "U-142"], ["V-3301", "2024-12-09T10:02", "U-142"]],
    "F-4A07": [["V-4032", "2025-03-04T11:20", "U-142"]],
}
F = "files"
tool(F, "search_files", "Find files whose file name contains the given text.",
     [("name", "string", "Part of the file name, e.g. 'report.pdf'")],
     consts={"FILES": FILES}, code='''
def search_files(name):
    q = str(name).strip().lower()
    if not q:
        return {"error": "empty file name"}
    hits = [{"file_id": k, "path": v[0]} for k, v in FILES.items()
            if q in v[0].rsplit("/", 1)[-1].lower()]
    if not hits:
        return {"error": "no file named like " + str(name)}
    return {"matches": hits}
''')
tool(F, "get_file_metadata", "Metadata of a file: path, size, owner id, last modified, sha256.",
     [("file_id", "string", "File id, e.g. 'F-0000'")], consts={"FILES": FILES}, code='''
def get_file_metadata(file_id):
    key = str(file_id).strip().upper()
    v = FILES.get(key)
    if v is None:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "path": v[0], "size_bytes": v[1], "owner_id": v[2],
            "modified": v[3], "sha256": v[4]}
''')
tool(F, "read_file", "Read the text content of a file (text files only).",
     [("file_id", "string", "File id")], consts={"FILES": FILES, "CONTENTS": CONTENTS}, code='''
def read_file(file_id):
    key = str(file_id).strip().upper()
    if key not in FILES:
        return {"error": "unknown file id " + str(file_id)}
    if key not in CONTENTS:
        return {"error": FILES[key][0] + " is a binary file and cannot be read as text"}
    return CONTENTS[key]
''')
tool(F, "get_user", "Directory entry of a user: name, email, team.",
     [("user_id", "string", "User id, e.g. 'U-000'")], consts={"USERS": USERS}, code='''
def get_user(user_id):
    key = str(user_id).strip().upper()
    u = USERS.get(key)
    if u is None:
        return {"error": "unknown user id " + str(user_id)}
    return {"user_id": key, "name": u[0], "email": u[1], "team": u[2]}
''')
tool(F, "list_versions", "Saved versions of a file, newest first, with their authors' user ids.",
     [("file_id", "string", "File id")], consts={"FILES": FILES, "VERSIONS": VERSIONS}, code='''
def list_versions(file_id):
    key = str(file_id).strip().upper()
    if key not in FILES:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "versions": [{"version_id": v, "saved": t, "author_id": a}
                                         for v, t, a in VERSIONS.get(key, [])]}
''')
tool(F, "restore_version", "Restore a file to one of its saved versions.",
     [("file_id", "string", "File id"), ("version_id", "string", "Version id, e.g. 'V-0000'")],
     consts={"VERSIONS": VERSIONS}, helpers=(HASH_SRC,), code='''
def restore_version(file_id, version_id):
    key, ver = str(file_id).strip().upper(), str(version_id).strip().upper()
    if ver not in [v[0] for v in VERSIONS.get(key, [])]:
        return {"error": "version " + str(version_id) + " not found for file " + str(file_id)}
    return {"restore_id": _h("RST", key, ver), "file_id": key, "restored_version": ver,
            "status": "restored"}
''')
tool(F, "share_file",
     "Share a file with a colleague by email (must be a directory email address).",
     [("file_id", "string", "File id"), ("email", "string", "Colleague's email address"),
      ("permission", "string", "Access level", ["view", "edit"])],
     consts={"FILES": FILES, "EMAILS": sorted(u[1] for u in USERS.values())},
     helpers=(HASH_SRC,), code='''
def share_file(file_id, email, permission):
    key = str(file_id).strip().upper()
    if key not in FILES:
        return {"error": "unknown file id " + str(file_id)}
    mail = str(email).strip().lower()
    if mail not in EMAILS:
        return {"error": str(email) + " is not in the company directory"}
    perm = str(permission).strip().lower()
    if perm not in ("view", "edit"):
        return {"error": "permission must be view or edit"}
    return {"share_id": _h("SHR", key, mail, perm), "file_id": key, "shared_with": mail,
            "permission": perm}
''')
tool(F, "delete_file", "Move a file to the trash.", [("file_id", "string", "File id")],
     consts={"IDS": sorted(FILES)}, code='''
def delete_file(file_id):
    key = str(file_id).strip().upper()
    if key not in IDS:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "status": "moved to trash"}
''')
tool(F, "move_file", "Move a file to another folder.",
     [("file_id", "string", "File id"), ("destination", "string", "Folder path")],
     consts={"IDS": sorted(FILES)}, code='''
def move_file(file_id, destination):
    key = str(file_id).strip().upper()
    if key not in IDS:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "folder": str(destination), "status": "moved"}
''')
tool(F, "get_storage_quota", "Storage used and allowed for a user.",
     [("user_id", "string", "User id")],
     consts={"QUOTA": {"U-207": ["41.2", "100"], "U-142": ["12.8", "50"]}}, code='''
def get_storage_quota(user_id):
    q = QUOTA.get(str(user_id).strip().upper())
    if q is None:
        return {"error": "no quota record for " + str(user_id)}
    return {"user_id": str(user_id).strip().upper(), "used_gb": q[0], "quota_gb": q[1]}
''')

omar, lena = "omar.haddad@northwind.example", "lena.vogt@northwind.example"
task(F, "Finance wants to confirm the integrity of the 2024 budget spreadsheet "
        "(budget_2024.xlsx). What is its SHA-256 checksum?",
     [("search_files", {"name": "budget_2024.xlsx"}, "F-3C91"),
      ("get_file_metadata", {"file_id": "F-3C91"},
       "9f2c41d0ab7e5c3318e0d7a64b21f90c55d1e8a3b6c7f4029d8e1a5b3c7d9e0f")],
     ["read_file", "get_storage_quota"])
task(F, "Someone edited our deploy runbook (deploy.md) and I want to ask its owner about it. "
        "Who owns that file? Give me their email address.",
     [("search_files", {"name": "deploy.md"}, "F-4A07"),
      ("get_file_metadata", {"file_id": "F-4A07"}, "U-142"),
      ("get_user", {"user_id": "U-142"}, "sofia.marin@northwind.example")],
     ["read_file", "list_versions"])
task(F, "Open the handover note (handover.txt). It points to another file that holds the final "
        "figures; I need the email address of that other file's owner.",
     [("search_files", {"name": "handover.txt"}, "F-5B12"),
      ("read_file", {"file_id": "F-5B12"}, "F-8D20"),
      ("get_file_metadata", {"file_id": "F-8D20"}, "U-311"),
      ("get_user", {"user_id": "U-311"}, "kwame.osei@northwind.example")],
     ["share_file", "move_file"])
task(F, "The latest save of logo_final.svg is broken. Restore the file to the version saved "
        "just before the latest one, then share the file with edit access with the person who "
        "authored that restored version. Give me the restore id and the share id.",
     [("search_files", {"name": "logo_final.svg"}, "F-7F58"),
      ("list_versions", {"file_id": "F-7F58"}, "V-1142"),
      ("restore_version", {"file_id": "F-7F58", "version_id": "V-1142"},
       H("RST", "F-7F58", "V-1142")),
      ("get_user", {"user_id": "U-199"}, omar),
      ("share_file", {"file_id": "F-7F58", "email": omar, "permission": "edit"},
       H("SHR", "F-7F58", omar, "edit"))],
     ["delete_file"])
task(F, "Legal wants the original author of nda_template.docx (whoever saved its very first "
        "version) to review the current template. Share the file with that person, view-only, "
        "and give me the share id.",
     [("search_files", {"name": "nda_template.docx"}, "F-6E44"),
      ("list_versions", {"file_id": "F-6E44"}, "V-2141"),
      ("get_user", {"user_id": "U-233"}, lena),
      ("share_file", {"file_id": "F-6E44", "email": lena, "permission": "view"},
       H("SHR", "F-6E44", lena, "view"))],
     ["get_file_metadata", "restore_version", "delete_file"])
task(F, "A bad config change went out in app.yaml. Roll the file back to the version that was "
        "saved on 2025-01-27 and tell me the restore id.",
     [("search_files", {"name": "app.yaml"}, "F-2D33"),
      ("list_versions", {"file_id": "F-2D33"}, "V-3318"),
      ("restore_version", {"file_id": "F-2D33", "version_id": "V-3318"},
       H("RST", "F-2D33", "V-3318"))],
     ["read_file", "move_file"])

# =========================================================================== shipping
ORDERS = {  # order: [customer, carrier, tracking number, [[item, price]]]
    "ORD-55120": ["Hanna Berg", "Parcelo Express", "PX7734019852",
                  [["Trail running shoes", "129.00"]]],
    "ORD-55187": ["Dev Patel", "Parcelo Express", "PX7734088410",
                  [["Espresso grinder", "249.00"], ["Descaler", "12.50"]]],
    "ORD-56002": ["Greta Holm", "Parcelo Express", "PX7735102267",
                  [["Noise-cancelling earbuds", "179.00"]]],
    "ORD-56349": ["Yusuf Demir", "Parcelo Express", "PX7736004915",
                  [["Ceramic dinner set", "214.90"]]],
    "ORD-57011": ["Chloe Martin", "Parcelo Express", "PX7736650038",
                  [["Yoga mat", "39.95"], ["Foam roller", "24.00"]]],
    "ORD-57290": ["Ines Navarro", "Parcelo Express", "PX7737120476",
                  [["Mirrorless camera body", "1149.00"]]],
    "ORD-57305": ["Ravi Kumar", "Parcelo Express", None, [["Desk lamp", "45.00"]]],
}
SHIPMENTS = {  # tracking: [status, facility, exception code, expected window, last event]
    "PX7734019852": ["held at customs: commercial invoice required", "FAC-LEJ2", None, None,
                     "2025-05-03T06:55 arrived at Leipzig Air Hub"],
    "PX7734088410": ["in transit", "FAC-MEM4", None, "2025-05-09 09:00-13:00",
                     "2025-05-06T22:14 processed at Memphis Super Hub"],
    "PX7735102267": ["delivery attempt failed: recipient absent", "FAC-HAM3", None, None,
                     "2025-05-12T15:40 returned to Hamburg City Depot"],
    "PX7736004915": ["delivered, damage reported", "FAC-LYS1", "EX-DMG-4471", None,
                     "2025-05-20T11:02 damage report logged at Lyon Saint-Exupery Depot"],
    "PX7736650038": ["out for delivery", "FAC-BCN1", None, "2025-06-12 14:00-18:00",
                     "2025-06-12T07:30 loaded on van at Barcelona Zona Franca"],
    "PX7737120476": ["lost in transit: trace closed", "FAC-MAD2", "EX-LST-9023", None,
                     "2025-06-02T19:10 trace closed at Madrid Coslada Hub"],
}
FACILITIES = {  # id: [name, phone, hours, claims desk, [[locker id, address]]]
    "FAC-LEJ2": ["Leipzig Air Hub", "+49 341 555 0120", "Mon-Sat 06:00-22:00", "CD-LEJ-02", []],
    "FAC-MEM4": ["Memphis Super Hub", "+1 901 555 0148", "24/7", "CD-MEM-11", []],
    "FAC-HAM3": ["Hamburg City Depot", "+49 40 555 0193", "Mon-Fri 07:00-20:00", "CD-HAM-05",
                 [["LK-HAM-0417", "Hafenstrasse 12"], ["LK-HAM-0522", "Bahnhofplatz 3"],
                  ["LK-HAM-0608", "Lange Reihe 88"]]],
    "FAC-LYS1": ["Lyon Saint-Exupery Depot", "+33 4 55 50 17 62", "Mon-Sat 08:00-19:00",
                 "CD-LYS-08", [["LK-LYS-0101", "Rue de la Republique 40"]]],
    "FAC-BCN1": ["Barcelona Zona Franca", "+34 93 555 0117", "Mon-Sat 07:00-21:00",
                 "CD-BCN-04", []],
    "FAC-MAD2": ["Madrid Coslada Hub", "+34 91 555 0176", "24/7", "CD-MAD-15",
                 [["LK-MAD-0230", "Calle de Alcala 120"]]],
}
S = "shipping"
tool(S, "lookup_order", "Look up an order: customer, items, carrier and tracking number.",
     [("order_number", "string", "Order number, e.g. 'ORD-00000'")],
     consts={"ORDERS": ORDERS}, code='''
def lookup_order(order_number):
    key = str(order_number).strip().upper()
    o = ORDERS.get(key)
    if o is None:
        return {"error": "unknown order " + str(order_number)}
    return {"order_number": key, "customer": o[0], "carrier": o[1],
            "tracking_number": o[2] or "not shipped yet",
            "items": [{"name": n, "price": p} for n, p in o[3]]}
''')
tool(S, "track_shipment",
     "Tracking status of a parcel: status, current facility id, delivery window, exception "
     "code (if any) and latest event.",
     [("tracking_number", "string", "Carrier tracking number")],
     consts={"SHIPMENTS": SHIPMENTS}, code='''
def track_shipment(tracking_number):
    key = str(tracking_number).strip().upper()
    s = SHIPMENTS.get(key)
    if s is None:
        return {"error": "unknown tracking number " + str(tracking_number)}
    return {"tracking_number": key, "status": s[0], "current_facility_id": s[1],
            "exception_code": s[2], "delivery_window": s[3], "latest_event": s[4]}
''')
tool(S, "get_facility",
     "Carrier facility details: name, phone, opening hours, claims desk id and parcel lockers.",
     [("facility_id", "string", "Facility id, e.g. 'FAC-XXX0'")],
     consts={"FACILITIES": FACILITIES}, code='''
def get_facility(facility_id):
    key = str(facility_id).strip().upper()
    f = FACILITIES.get(key)
    if f is None:
        return {"error": "unknown facility " + str(facility_id)}
    return {"facility_id": key, "name": f[0], "phone": f[1], "hours": f[2],
            "claims_desk_id": f[3],
            "lockers": [{"locker_id": lk, "address": a} for lk, a in f[4]]}
''')
tool(S, "redirect_to_locker",
     "Redirect a parcel held at a facility to one of that facility's parcel lockers.",
     [("tracking_number", "string", "Carrier tracking number"),
      ("locker_id", "string", "Locker id, e.g. 'LK-XXX-0000'")],
     consts={"SHIPMENTS": SHIPMENTS, "FACILITIES": FACILITIES}, helpers=(HASH_SRC,), code='''
def redirect_to_locker(tracking_number, locker_id):
    key = str(tracking_number).strip().upper()
    s = SHIPMENTS.get(key)
    if s is None:
        return {"error": "unknown tracking number " + str(tracking_number)}
    lk = str(locker_id).strip().upper()
    lockers = dict(FACILITIES[s[1]][4])
    if lk not in lockers:
        return {"error": "locker " + str(locker_id) + " is not served by " + s[1]}
    return {"redirect_id": _h("RDR", key, lk), "tracking_number": key, "locker_id": lk,
            "address": lockers[lk], "pickup_pin": _h("PIN", key, lk)}
''')
tool(S, "file_claim",
     "File a loss/damage claim. Needs the shipment's exception code and the claims desk of "
     "the facility handling it.",
     [("tracking_number", "string", "Carrier tracking number"),
      ("exception_code", "string", "Exception code from tracking, e.g. 'EX-XXX-0000'"),
      ("claims_desk_id", "string", "Claims desk id from get_facility")],
     consts={"SHIPMENTS": SHIPMENTS, "FACILITIES": FACILITIES}, helpers=(HASH_SRC,), code='''
def file_claim(tracking_number, exception_code, claims_desk_id):
    key = str(tracking_number).strip().upper()
    s = SHIPMENTS.get(key)
    if s is None:
        return {"error": "unknown tracking number " + str(tracking_number)}
    exc = str(exception_code).strip().upper()
    if s[2] is None or exc != s[2]:
        return {"error": "exception code does not match shipment " + key}
    desk = str(claims_desk_id).strip().upper()
    if desk != FACILITIES[s[1]][3]:
        return {"error": "claims desk " + str(claims_desk_id) + " does not handle " + key}
    return {"claim_id": _h("CLM", key, exc), "tracking_number": key, "desk": desk,
            "status": "submitted"}
''')
tool(S, "get_claim_status", "Status of a loss/damage claim and its payout reference.",
     [("claim_id", "string", "Claim id, e.g. 'CLM-000000'")], helpers=(HASH_SRC,), code='''
def get_claim_status(claim_id):
    import re
    c = str(claim_id).strip().upper()
    if not re.fullmatch(r"CLM-[0-9A-F]{6}", c):
        return {"error": "unknown claim " + str(claim_id)}
    return {"claim_id": c, "status": "approved", "payout_reference": _h("PAY", c),
            "payout_in_days": 5}
''')
tool(S, "get_shipping_rates", "Quote parcel rates between two postal codes.",
     [("origin_zip", "string", "Origin postal code"),
      ("dest_zip", "string", "Destination postal code"),
      ("weight_kg", "number", "Parcel weight in kg")], code='''
def get_shipping_rates(origin_zip, dest_zip, weight_kg):
    try:
        w = float(weight_kg)
    except (TypeError, ValueError):
        return {"error": "weight_kg must be a number"}
    if w <= 0 or w > 30:
        return {"error": "weight must be between 0 and 30 kg"}
    return {"rates": [{"service": "economy", "price": "%.2f" % (6.5 + 1.2 * w)},
                      {"service": "express", "price": "%.2f" % (14.0 + 2.1 * w)}]}
''')
tool(S, "cancel_order", "Cancel an order that has not shipped yet.",
     [("order_number", "string", "Order number")], consts={"ORDERS": ORDERS}, code='''
def cancel_order(order_number):
    key = str(order_number).strip().upper()
    o = ORDERS.get(key)
    if o is None:
        return {"error": "unknown order " + str(order_number)}
    if o[2]:
        return {"error": key + " has already shipped and cannot be cancelled"}
    return {"order_number": key, "status": "cancelled"}
''')
tool(S, "update_delivery_address", "Change the delivery address of a parcel in transit.",
     [("tracking_number", "string", "Carrier tracking number"),
      ("address", "string", "New street address")], consts={"TRACKED": sorted(SHIPMENTS)},
     code='''
def update_delivery_address(tracking_number, address):
    key = str(tracking_number).strip().upper()
    if key not in TRACKED:
        return {"error": "unknown tracking number " + str(tracking_number)}
    return {"tracking_number": key, "status": "address change requested",
            "address": str(address)}
''')

clm4 = H("CLM", "PX7736004915", "EX-DMG-4471")
clm6 = H("CLM", "PX7737120476", "EX-LST-9023")
task(S, "A customer asks why order ORD-55120 hasn't arrived. Look up the order, track the "
        "parcel, and tell me its current status.",
     [("lookup_order", {"order_number": "ORD-55120"}, "PX7734019852"),
      ("track_shipment", {"tracking_number": "PX7734019852"}, "commercial invoice required")],
     ["cancel_order", "get_shipping_rates"])
task(S, "Order ORD-55187 seems stuck. Find out which carrier facility the parcel is at right "
        "now and give me that facility's phone number so I can call them.",
     [("lookup_order", {"order_number": "ORD-55187"}, "PX7734088410"),
      ("track_shipment", {"tracking_number": "PX7734088410"}, "FAC-MEM4"),
      ("get_facility", {"facility_id": "FAC-MEM4"}, "+1 901 555 0148")],
     ["update_delivery_address", "file_claim"])
task(S, "Delivery of order ORD-56002 failed because nobody was home. Redirect the parcel to the "
        "parcel locker on Bahnhofplatz served by the facility now holding it, and give me the "
        "pickup PIN for the customer.",
     [("lookup_order", {"order_number": "ORD-56002"}, "PX7735102267"),
      ("track_shipment", {"tracking_number": "PX7735102267"}, "FAC-HAM3"),
      ("get_facility", {"facility_id": "FAC-HAM3"}, "LK-HAM-0522"),
      ("redirect_to_locker", {"tracking_number": "PX7735102267", "locker_id": "LK-HAM-0522"},
       H("PIN", "PX7735102267", "LK-HAM-0522"))],
     ["update_delivery_address", "cancel_order"])
task(S, "The dinner set from order ORD-56349 arrived smashed. File a damage claim (it needs the "
        "shipment's exception code and the claims desk of the facility handling it), then "
        "check the claim's status and give me the payout reference.",
     [("lookup_order", {"order_number": "ORD-56349"}, "PX7736004915"),
      ("track_shipment", {"tracking_number": "PX7736004915"}, "EX-DMG-4471"),
      ("get_facility", {"facility_id": "FAC-LYS1"}, "CD-LYS-08"),
      ("file_claim", {"tracking_number": "PX7736004915", "exception_code": "EX-DMG-4471",
                      "claims_desk_id": "CD-LYS-08"}, clm4),
      ("get_claim_status", {"claim_id": clm4}, H("PAY", clm4))],
     ["redirect_to_locker"])
task(S, "Chloe is waiting at home for order ORD-57011. What delivery time window does the "
        "carrier give for it?",
     [("lookup_order", {"order_number": "ORD-57011"}, "PX7736650038"),
      ("track_shipment", {"tracking_number": "PX7736650038"}, "14:00-18:00")],
     ["get_facility", "update_delivery_address"])
task(S, "The camera in order ORD-57290 was lost in transit. File a loss claim with the right "
        "exception code and claims desk, then tell me the claim's payout reference.",
     [("lookup_order", {"order_number": "ORD-57290"}, "PX7737120476"),
      ("track_shipment", {"tracking_number": "PX7737120476"}, "EX-LST-9023"),
      ("get_facility", {"facility_id": "FAC-MAD2"}, "CD-MAD-15"),
      ("file_claim", {"tracking_number": "PX7737120476", "exception_code": "EX-LST-9023",
                      "claims_desk_id": "CD-MAD-15"}, clm6),
      ("get_claim_status", {"claim_id": clm6}, H("PAY", clm6))],
     ["cancel_order", "get_shipping_rates", "redirect_to_locker"])


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
        "sub_qa_dict": json.dumps(
            {c[0]: c[2] if isinstance(c[2], list) else [c[2]] for c in t["chain"]},
            ensure_ascii=False,
        ),
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
    need(
        isinstance(prompt, list) and len(prompt) == 1 and prompt[0]["role"] == "user",
        "prompt must be one user message",
    )
    ptext = norm(prompt[0]["content"])
    names = [s["function"]["name"] for s in schema]
    need(
        all(
            s["type"] == "function" and s["function"]["parameters"]["type"] == "object"
            for s in schema
        ),
        "malformed schema",
    )
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
        args = {
            p: BOGUS[d["type"]]
            for p, d in f["parameters"]["properties"].items()
            if p in f["parameters"]["required"]
        }
        try:
            out = funcs[f["name"]](**args)
            json.dumps(out)
        except Exception as exc:
            need(False, f"{f['name']}(**{args}) raised {exc!r}")
        need(isinstance(out, (str, dict, list)), f"{f['name']} returned {type(out)}")
    ref = rec["reference"]
    need(2 <= len(ref) <= 5, f"chain length {len(ref)}")
    need(
        [c["name"] for c in ref] == list(sub_qa) and len(ref) == len(set(sub_qa)),
        "reference must call exactly the sub_qa tools, once each",
    )
    n_distract = len(names) - len(sub_qa)
    need(1 <= n_distract <= 3, f"{n_distract} distractors")
    outs = []
    for i, call in enumerate(ref):
        name, args = call["name"], call["arguments"]
        props = next(s["function"]["parameters"] for s in schema if s["function"]["name"] == name)
        need(
            set(props["required"]) <= set(args) <= set(props["properties"]),
            f"{name} arguments {sorted(args)} do not fit its schema",
        )
        text = as_text(funcs[name](**args))
        need("error" not in text.lower()[:12], f"{name} returned an error: {text}")
        golds = sub_qa[name]
        need(any(norm(g) in norm(text) for g in golds), f"{name} output {text!r} lacks {golds}")
        for g in golds:
            need(len(g.strip()) >= 3, f"gold {g!r} too short")
            need(norm(g) not in ptext, f"gold {g!r} appears in the prompt")
            need(
                all(norm(g) not in norm(o) for o in outs),
                f"gold {g!r} of {name} already appears in an earlier output",
            )
        if i:
            earlier = "\n".join(outs)
            linked = [str(v) for v in args.values() if str(v) in earlier]
            need(linked, f"{name}: no argument comes from an earlier output")
            need(
                any(norm(v) not in ptext for v in linked),
                f"{name}: its linking value(s) {linked} appear in the prompt",
            )
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
    print(
        f"ok: {len(train)} train + {len(heldout)} heldout tasks, {size} bytes; "
        f"chain lengths {dict(sorted(lengths.items()))}"
    )


if __name__ == "__main__":
    main()
