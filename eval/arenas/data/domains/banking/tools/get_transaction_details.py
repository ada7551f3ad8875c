def get_transaction_details(txn_id):
    key = str(txn_id).strip().upper()
    v = TXNS.get(key)
    if v is None:
        return {"error": "unknown transaction " + str(txn_id)}
    return {"txn_id": key, "account_id": v[0], "date": v[1], "merchant": v[2],
            "amount": _m(v[3]), "currency": "USD", "auth_code": v[4],
            "merchant_category_code": v[5], "status": "posted"}
