def dispute_transaction(txn_id, auth_code, reason):
    key = str(txn_id).strip().upper()
    v = TXNS.get(key)
    if v is None:
        return {"error": "unknown transaction " + str(txn_id)}
    if str(auth_code).strip().upper() != v[4]:
        return {"error": "authorization code does not match transaction " + key}
    r = str(reason).strip().lower()
    if r not in REASONS:
        return {"error": "reason must be one of " + ", ".join(REASONS)}
    return {"case_id": _h("DSP", key, r), "txn_id": key, "reason": r, "status": "opened"}
