def get_room_quote(hotel_id, room_code, checkin, nights):
    import re
    hid = str(hotel_id).strip().upper()
    h = HOTELS.get(hid)
    if h is None:
        return {"error": "unknown hotel id " + str(hotel_id)}
    rc = str(room_code).strip().upper()
    if rc not in h["rooms"]:
        return {"error": "room " + str(room_code) + " is not offered by " + hid}
    day = str(checkin).strip()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", day):
        return {"error": "checkin must be YYYY-MM-DD"}
    try:
        n = int(nights)
    except (TypeError, ValueError):
        return {"error": "nights must be an integer"}
    if not 1 <= n <= 30:
        return {"error": "nights must be between 1 and 30"}
    sub = h["rooms"][rc][1] * n
    tax = (sub + 5) // 10
    return {"quote_id": _h("QT", hid, rc, day, n), "hotel_id": hid, "room_code": rc,
            "room_type": h["rooms"][rc][0], "checkin": day, "nights": n,
            "subtotal": _m(sub), "tax": _m(tax), "total": _m(sub + tax), "currency": "EUR"}
