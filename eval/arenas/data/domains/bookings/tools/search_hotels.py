def search_hotels(city, max_rate=None):
    c = str(city).strip().lower()
    rows = []
    for hid, h in HOTELS.items():
        if h["city"].lower() != c:
            continue
        low = min(r[1] for r in h["rooms"].values())
        if max_rate is not None:
            try:
                if low > float(max_rate) * 100:
                    continue
            except (TypeError, ValueError):
                return {"error": "max_rate must be a number"}
        rows.append((low, {"hotel_id": hid, "name": h["name"], "rating": h["rating"],
                           "from_rate": _m(low)}))
    if not rows:
        return {"error": "no hotels found in " + str(city)}
    rows.sort(key=lambda r: r[0])
    return {"city": str(city).strip(), "currency": "EUR", "results": [r[1] for r in rows]}
