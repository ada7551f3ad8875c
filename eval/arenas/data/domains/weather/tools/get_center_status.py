def get_center_status(center_id):
    key = str(center_id).strip().upper()
    for rows in CENTERS.values():
        for c, n, cap, occ in rows:
            if c == key:
                return {"center_id": c, "name": n, "status": "open", "occupied": occ,
                        "open_beds": cap - occ, "intake_code": _h("INT", c)}
    return {"error": "unknown center " + str(center_id)}
