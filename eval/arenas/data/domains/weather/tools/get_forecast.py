def get_forecast(location_id, date):
    key = str(location_id).strip().upper()
    if key not in FORECASTS:
        return {"error": "unknown location " + str(location_id)}
    f = FORECASTS[key].get(str(date).strip())
    if f is None:
        return {"error": "no forecast for " + key + " on " + str(date)}
    return {"location_id": key, "date": str(date).strip(), "condition": f[0], "high_c": f[1],
            "low_c": f[2], "precip_mm": f[3], "wind_kph": f[4]}
