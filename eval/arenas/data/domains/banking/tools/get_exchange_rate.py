def get_exchange_rate(base, quote):
    pair = str(base).strip().upper() + "/" + str(quote).strip().upper()
    if pair not in FX:
        return {"error": "no rate for " + pair}
    return {"pair": pair, "rate": FX[pair]}
