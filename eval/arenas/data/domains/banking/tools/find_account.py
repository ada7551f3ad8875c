def find_account(customer_name):
    who = " ".join(str(customer_name).split()).lower()
    rows = [{"account_id": k, "type": v[1], "last4": v[2]} for k, v in ACCOUNTS.items()
            if v[0].lower() == who]
    if not rows:
        return {"error": "no customer named " + str(customer_name)}
    return {"customer": str(customer_name).strip(), "accounts": rows}
