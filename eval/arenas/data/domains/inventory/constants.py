"""Tables of the inventory arena: literals only (read with ast.literal_eval, never run)."""

# PRODUCTS: sku: [name, category, on hand per warehouse, reorder point, supplier]
PRODUCTS = {
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

SALES = {"SKU-30118": 212, "SKU-41207": 57, "SKU-63310": 344}

# SKUS: the ids of PRODUCTS, sorted (keep in step with PRODUCTS)
SKUS = ["SKU-30118", "SKU-30155", "SKU-41207", "SKU-41290", "SKU-52044", "SKU-52071", "SKU-63310"]
