def get_shipping_rates(origin_zip, dest_zip, weight_kg):
    try:
        w = float(weight_kg)
    except (TypeError, ValueError):
        return {"error": "weight_kg must be a number"}
    if w <= 0 or w > 30:
        return {"error": "weight must be between 0 and 30 kg"}
    return {"rates": [{"service": "economy", "price": "%.2f" % (6.5 + 1.2 * w)},
                      {"service": "express", "price": "%.2f" % (14.0 + 2.1 * w)}]}
