def get_evacuation_centers(zone_id):
    key = str(zone_id).strip().upper()
    if key not in CENTERS:
        return {"error": "unknown zone " + str(zone_id)}
    return {"zone_id": key, "centers": [{"center_id": c, "name": n, "capacity": cap}
                                        for c, n, cap, _ in CENTERS[key]]}
