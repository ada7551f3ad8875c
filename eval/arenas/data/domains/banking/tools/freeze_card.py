def freeze_card(account_id):
    key = str(account_id).strip().upper()
    if key not in ACCTS:
        return {"error": "unknown account " + str(account_id)}
    return {"account_id": key, "card_status": "frozen"}
