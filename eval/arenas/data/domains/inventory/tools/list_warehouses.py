def list_warehouses():
    return {"warehouses": [{"warehouse_id": k, "city": v[0]} for k, v in WAREHOUSES.items()]}
