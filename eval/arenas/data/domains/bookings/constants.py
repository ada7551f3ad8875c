"""Tables of the bookings arena: literals only (read with ast.literal_eval, never run)."""

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

FLIGHTS = {
    ("london", "lisbon"): [["TP1351", "07:15", "189.00"], ["BA500", "12:40", "214.00"]],
    ("paris", "porto"): [["TP443", "09:05", "132.00"]],
    ("tokyo", "osaka"): [["JL123", "08:00", "96.00"]],
}

RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "JPY": 162.4, "NOK": 11.6}

REVIEWS = {
    "lisbon": [["Taberna do Largo", "4.6"], ["Cervejaria Ramiro", "4.7"]],
    "porto": [["Cantinho do Avillez", "4.5"]],
    "kyoto": [["Menbaka Fire Ramen", "4.4"]],
    "oslo": [["Fiskeriet Youngstorget", "4.5"]],
}
