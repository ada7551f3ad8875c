def update_product_price(sku, new_price):
    key = str(sku).strip().upper()
    if key not in SKUS:
        return {"error": "unknown sku " + str(sku)}
    try:
        price = float(new_price)
    except (TypeError, ValueError):
        return {"error": "new_price must be a number"}
    return {"sku": key, "list_price": "%.2f" % price, "status": "updated"}
