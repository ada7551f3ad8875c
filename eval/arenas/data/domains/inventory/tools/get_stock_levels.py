def get_stock_levels(sku):
    key = str(sku).strip().upper()
    p = PRODUCTS.get(key)
    if p is None:
        return {"error": "unknown sku " + str(sku)}
    return {"sku": key, "name": p[0],
            "warehouses": [{"warehouse_id": w, "on_hand": q} for w, q in p[2].items()],
            "total_on_hand": sum(p[2].values()), "reorder_point": p[3],
            "primary_supplier_id": p[4]}
