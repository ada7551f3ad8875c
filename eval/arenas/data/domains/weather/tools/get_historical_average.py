def get_historical_average(city, month):
    t = CLIMATE.get(str(city).strip().lower())
    if t is None:
        return {"error": "no climate normals for " + str(city)}
    return {"city": str(city), "month": month, "mean_temp_c": t}
