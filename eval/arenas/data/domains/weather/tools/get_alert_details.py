def get_alert_details(alert_id):
    key = str(alert_id).strip().upper()
    a = ALERT_INFO.get(key)
    if a is None:
        return {"error": "unknown alert " + str(alert_id)}
    return {"alert_id": key, "headline": a[0], "expires": a[1], "zone_id": a[2]}
