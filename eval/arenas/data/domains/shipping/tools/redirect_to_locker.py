def redirect_to_locker(tracking_number, locker_id):
    key = str(tracking_number).strip().upper()
    s = SHIPMENTS.get(key)
    if s is None:
        return {"error": "unknown tracking number " + str(tracking_number)}
    lk = str(locker_id).strip().upper()
    lockers = dict(FACILITIES[s[1]][4])
    if lk not in lockers:
        return {"error": "locker " + str(locker_id) + " is not served by " + s[1]}
    return {"redirect_id": _h("RDR", key, lk), "tracking_number": key, "locker_id": lk,
            "address": lockers[lk], "pickup_pin": _h("PIN", key, lk)}
