def get_station_observations(station_id, date):
    key = str(station_id).strip().upper()
    if key not in OBS:
        return {"error": "no observations for station " + str(station_id)}
    o = OBS[key].get(str(date).strip())
    if o is None:
        return {"error": "no observations at " + key + " on " + str(date)}
    return {"station_id": key, "date": str(date).strip(), "temp_c": o[0], "peak_gust_kph": o[1],
            "humidity_pct": o[2], "pressure_hpa": o[3]}
