def get_sunrise_sunset(location_id, date):
    s = SUN.get(str(location_id).strip().upper())
    if s is None:
        return {"error": "no almanac data for " + str(location_id)}
    return {"date": str(date), "sunrise": s[0], "sunset": s[1]}
