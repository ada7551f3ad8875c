def get_balance(account_id):
    key = str(account_id).strip().upper()
    a = ACCOUNTS.get(key)
    if a is None:
        return {"error": "unknown account " + str(account_id)}
    return {"account_id": key, "type": a[1], "available_balance": _m(a[3]), "currency": "USD"}
