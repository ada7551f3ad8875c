def get_facility(facility_id):
    key = str(facility_id).strip().upper()
    f = FACILITIES.get(key)
    if f is None:
        return {"error": "unknown facility " + str(facility_id)}
    return {"facility_id": key, "name": f[0], "phone": f[1], "hours": f[2],
            "claims_desk_id": f[3],
            "lockers": [{"locker_id": lk, "address": a} for lk, a in f[4]]}
