def get_nearest_station(location_id):
    key = str(location_id).strip().upper()
    s = STATIONS.get(key)
    if s is None:
        return {"error": "unknown location " + str(location_id)}
    return {"location_id": key, "station_id": s[0], "name": s[1], "distance_km": s[2]}
