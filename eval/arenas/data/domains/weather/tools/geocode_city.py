def geocode_city(city):
    key = str(city).split(",")[0].strip().lower()
    v = LOCS.get(key)
    if v is None:
        return {"error": "unknown city " + str(city)}
    return {"location_id": v[0], "name": v[1], "lat": v[2], "lon": v[3], "timezone": v[4]}
