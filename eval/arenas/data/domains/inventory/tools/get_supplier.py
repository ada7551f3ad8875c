def get_supplier(supplier_id):
    key = str(supplier_id).strip().upper()
    s = SUPPLIERS.get(key)
    if s is None:
        return {"error": "unknown supplier id " + str(supplier_id)}
    return {"supplier_id": key, "name": s["name"], "vendor_account": s["vendor_account"],
            "lead_time_days": s["lead_time_days"], "order_email": s["email"],
            "price_list": [{"sku": k, "unit_cost": _m(v)} for k, v in s["costs"].items()]}
