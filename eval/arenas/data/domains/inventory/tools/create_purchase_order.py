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
