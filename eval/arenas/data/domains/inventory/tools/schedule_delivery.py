def schedule_delivery(po_number, warehouse_id):
    import re
    po = str(po_number).strip().upper()
    if not re.fullmatch(r"PO-[0-9A-F]{6}", po):
        return {"error": "unknown purchase order " + str(po_number)}
    wh = str(warehouse_id).strip().upper()
    if wh not in WAREHOUSES:
        return {"error": "unknown warehouse " + str(warehouse_id)}
    return {"delivery_id": _h("DLV", po, wh), "po_number": po, "warehouse_id": wh,
            "city": WAREHOUSES[wh][0], "dock": WAREHOUSES[wh][1], "status": "scheduled"}
