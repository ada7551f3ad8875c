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
