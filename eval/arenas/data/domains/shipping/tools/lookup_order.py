def lookup_order(order_number):
    key = str(order_number).strip().upper()
    o = ORDERS.get(key)
    if o is None:
        return {"error": "unknown order " + str(order_number)}
    return {"order_number": key, "customer": o[0], "carrier": o[1],
            "tracking_number": o[2] or "not shipped yet",
            "items": [{"name": n, "price": p} for n, p in o[3]]}
