def get_hotel_details(hotel_id):
    hid = str(hotel_id).strip().upper()
    h = HOTELS.get(hid)
    if h is None:
        return {"error": "unknown hotel id " + str(hotel_id)}
    rooms = [{"room_code": k, "type": v[0], "nightly_rate": _m(v[1])}
             for k, v in h["rooms"].items()]
    return {"hotel_id": hid, "name": h["name"], "city": h["city"], "address": h["address"],
            "rating": h["rating"], "amenities": h["amenities"], "currency": "EUR",
            "rooms": rooms}
