def get_loan_offers(customer_name):
    o = OFFERS.get(" ".join(str(customer_name).split()).lower())
    if o is None:
        return {"offers": []}
    return {"offers": [{"kind": o[0], "max_amount": o[1], "apr_pct": o[2]}]}
