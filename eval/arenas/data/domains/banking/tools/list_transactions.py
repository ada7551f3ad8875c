def list_transactions(account_id, month):
    key = str(account_id).strip().upper()
    if key not in ACCOUNTS:
        return {"error": "unknown account " + str(account_id)}
    m = str(month).strip()
    rows = [{"txn_id": t, "date": v[1], "merchant": v[2], "amount": _m(v[3])}
            for t, v in TXNS.items() if v[0] == key and v[1].startswith(m + "-")]
    return {"account_id": key, "month": m, "currency": "USD", "transactions": rows}
