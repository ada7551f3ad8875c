def convert_currency(amount, from_currency, to_currency):
    a, b = str(from_currency).strip().upper(), str(to_currency).strip().upper()
    if a not in RATES or b not in RATES:
        return {"error": "unsupported currency pair " + a + "/" + b}
    try:
        value = float(amount)
    except (TypeError, ValueError):
        return {"error": "amount must be a number"}
    return {"amount": "%.2f" % (value / RATES[a] * RATES[b]), "currency": b}
