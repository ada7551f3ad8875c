def get_weather_alerts(location_id):
    key = str(location_id).strip().upper()
    if key not in KNOWN:
        return {"error": "unknown location " + str(location_id)}
    return {"location_id": key, "alerts": [{"alert_id": a, "event": e, "severity": s}
                                           for a, e, s in ALERTS.get(key, [])]}
