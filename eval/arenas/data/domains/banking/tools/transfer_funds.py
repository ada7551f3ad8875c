def transfer_funds(from_account_id, to_account_id, amount):
    a, b = str(from_account_id).strip().upper(), str(to_account_id).strip().upper()
    if a not in ACCOUNTS or b not in ACCOUNTS or a == b:
        return {"error": "invalid account pair " + a + " -> " + b}
    try:
        cents = int(round(float(amount) * 100))
    except (TypeError, ValueError):
        return {"error": "amount must be a number"}
    if not 0 < cents <= ACCOUNTS[a][3]:
        return {"error": "insufficient funds or invalid amount"}
    return {"transfer_id": _h("TRF", a, b, cents), "amount": _m(cents), "currency": "USD",
            "from_balance_after": _m(ACCOUNTS[a][3] - cents), "status": "completed"}
