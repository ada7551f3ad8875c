def track_shipment(tracking_number):
    key = str(tracking_number).strip().upper()
    s = SHIPMENTS.get(key)
    if s is None:
        return {"error": "unknown tracking number " + str(tracking_number)}
    return {"tracking_number": key, "status": s[0], "current_facility_id": s[1],
            "exception_code": s[2], "delivery_window": s[3], "latest_event": s[4]}
