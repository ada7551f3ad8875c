def search_flights(origin, destination, date):
    key = (str(origin).strip().lower(), str(destination).strip().lower())
    rows = FLIGHTS.get(key)
    if not rows:
        return {"error": "no direct flights from " + str(origin) + " to " + str(destination)}
    return {"date": str(date), "flights": [{"flight": f, "departs": t, "fare_eur": p}
                                           for f, t, p in rows]}
