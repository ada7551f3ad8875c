def get_storage_quota(user_id):
    q = QUOTA.get(str(user_id).strip().upper())
    if q is None:
        return {"error": "no quota record for " + str(user_id)}
    return {"user_id": str(user_id).strip().upper(), "used_gb": q[0], "quota_gb": q[1]}
