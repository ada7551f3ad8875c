"""Tables of the shipping arena: literals only (read with ast.literal_eval, never run)."""

# ORDERS: order: [customer, carrier, tracking number, [[item, price]]]
ORDERS = {
    "ORD-55120": [
        "Hanna Berg",
        "Parcelo Express",
        "PX7734019852",
        [["Trail running shoes", "129.00"]],
    ],
    "ORD-55187": [
        "Dev Patel",
        "Parcelo Express",
        "PX7734088410",
        [["Espresso grinder", "249.00"], ["Descaler", "12.50"]],
    ],
    "ORD-56002": [
        "Greta Holm",
        "Parcelo Express",
        "PX7735102267",
        [["Noise-cancelling earbuds", "179.00"]],
    ],
    "ORD-56349": [
        "Yusuf Demir",
        "Parcelo Express",
        "PX7736004915",
        [["Ceramic dinner set", "214.90"]],
    ],
    "ORD-57011": [
        "Chloe Martin",
        "Parcelo Express",
        "PX7736650038",
        [["Yoga mat", "39.95"], ["Foam roller", "24.00"]],
    ],
    "ORD-57290": [
        "Ines Navarro",
        "Parcelo Express",
        "PX7737120476",
        [["Mirrorless camera body", "1149.00"]],
    ],
    "ORD-57305": ["Ravi Kumar", "Parcelo Express", None, [["Desk lamp", "45.00"]]],
}

# SHIPMENTS: tracking: [status, facility, exception code, expected window, last event]
SHIPMENTS = {
    "PX7734019852": [
        "held at customs: commercial invoice required",
        "FAC-LEJ2",
        None,
        None,
        "2025-05-03T06:55 arrived at Leipzig Air Hub",
    ],
    "PX7734088410": [
        "in transit",
        "FAC-MEM4",
        None,
        "2025-05-09 09:00-13:00",
        "2025-05-06T22:14 processed at Memphis Super Hub",
    ],
    "PX7735102267": [
        "delivery attempt failed: recipient absent",
        "FAC-HAM3",
        None,
        None,
        "2025-05-12T15:40 returned to Hamburg City Depot",
    ],
    "PX7736004915": [
        "delivered, damage reported",
        "FAC-LYS1",
        "EX-DMG-4471",
        None,
        "2025-05-20T11:02 damage report logged at Lyon Saint-Exupery Depot",
    ],
    "PX7736650038": [
        "out for delivery",
        "FAC-BCN1",
        None,
        "2025-06-12 14:00-18:00",
        "2025-06-12T07:30 loaded on van at Barcelona Zona Franca",
    ],
    "PX7737120476": [
        "lost in transit: trace closed",
        "FAC-MAD2",
        "EX-LST-9023",
        None,
        "2025-06-02T19:10 trace closed at Madrid Coslada Hub",
    ],
}

# FACILITIES: id: [name, phone, hours, claims desk, [[locker id, address]]]
FACILITIES = {
    "FAC-LEJ2": ["Leipzig Air Hub", "+49 341 555 0120", "Mon-Sat 06:00-22:00", "CD-LEJ-02", []],
    "FAC-MEM4": ["Memphis Super Hub", "+1 901 555 0148", "24/7", "CD-MEM-11", []],
    "FAC-HAM3": [
        "Hamburg City Depot",
        "+49 40 555 0193",
        "Mon-Fri 07:00-20:00",
        "CD-HAM-05",
        [
            ["LK-HAM-0417", "Hafenstrasse 12"],
            ["LK-HAM-0522", "Bahnhofplatz 3"],
            ["LK-HAM-0608", "Lange Reihe 88"],
        ],
    ],
    "FAC-LYS1": [
        "Lyon Saint-Exupery Depot",
        "+33 4 55 50 17 62",
        "Mon-Sat 08:00-19:00",
        "CD-LYS-08",
        [["LK-LYS-0101", "Rue de la Republique 40"]],
    ],
    "FAC-BCN1": [
        "Barcelona Zona Franca",
        "+34 93 555 0117",
        "Mon-Sat 07:00-21:00",
        "CD-BCN-04",
        [],
    ],
    "FAC-MAD2": [
        "Madrid Coslada Hub",
        "+34 91 555 0176",
        "24/7",
        "CD-MAD-15",
        [["LK-MAD-0230", "Calle de Alcala 120"]],
    ],
}

# TRACKED: the ids of SHIPMENTS, sorted (keep in step with SHIPMENTS)
TRACKED = [
    "PX7734019852",
    "PX7734088410",
    "PX7735102267",
    "PX7736004915",
    "PX7736650038",
    "PX7737120476",
]
