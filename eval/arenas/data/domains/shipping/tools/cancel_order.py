def cancel_order(order_number):
    key = str(order_number).strip().upper()
    o = ORDERS.get(key)
    if o is None:
        return {"error": "unknown order " + str(order_number)}
    if o[2]:
        return {"error": key + " has already shipped and cannot be cancelled"}
    return {"order_number": key, "status": "cancelled"}
