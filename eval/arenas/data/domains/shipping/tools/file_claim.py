def file_claim(tracking_number, exception_code, claims_desk_id):
    key = str(tracking_number).strip().upper()
    s = SHIPMENTS.get(key)
    if s is None:
        return {"error": "unknown tracking number " + str(tracking_number)}
    exc = str(exception_code).strip().upper()
    if s[2] is None or exc != s[2]:
        return {"error": "exception code does not match shipment " + key}
    desk = str(claims_desk_id).strip().upper()
    if desk != FACILITIES[s[1]][3]:
        return {"error": "claims desk " + str(claims_desk_id) + " does not handle " + key}
    return {"claim_id": _h("CLM", key, exc), "tracking_number": key, "desk": desk,
            "status": "submitted"}
