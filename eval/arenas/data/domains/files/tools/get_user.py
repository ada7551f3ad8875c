def get_user(user_id):
    key = str(user_id).strip().upper()
    u = USERS.get(key)
    if u is None:
        return {"error": "unknown user id " + str(user_id)}
    return {"user_id": key, "name": u[0], "email": u[1], "team": u[2]}
