"""Tables of the banking arena: literals only (read with ast.literal_eval, never run)."""

# ACCOUNTS: id: [owner, type, last4, available balance in cents]
ACCOUNTS = {
    "ACC-30417": ["Marta Kowalski", "checking", "4417", 231055],
    "ACC-30452": ["Marta Kowalski", "savings", "9052", 1284000],
    "ACC-51880": ["Jonah Feld", "checking", "1880", 87420],
    "ACC-51893": ["Jonah Feld", "savings", "7393", 412090],
    "ACC-62209": ["Priya Natarajan", "checking", "2209", 560312],
    "ACC-73341": ["Luis Ortega", "checking", "3341", 129900],
    "ACC-73368": ["Luis Ortega", "savings", "3368", 2250075],
}

# TXNS: id: [account, date, merchant, cents, auth code, merchant category code]
TXNS = {
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

FX = {"USD/EUR": "0.9260", "USD/GBP": "0.7890", "EUR/USD": "1.0800"}

OFFERS = {
    "marta kowalski": ["personal", "15000.00", "7.9"],
    "luis ortega": ["auto", "28000.00", "5.4"],
}

# ACCTS: the ids of ACCOUNTS, sorted (keep in step with ACCOUNTS)
ACCTS = ["ACC-30417", "ACC-30452", "ACC-51880", "ACC-51893", "ACC-62209", "ACC-73341", "ACC-73368"]
