def get_sales_report(sku, month):
    key = str(sku).strip().upper()
    if key not in SALES:
        return {"error": "no sales data for " + str(sku)}
    return {"sku": key, "month": str(month), "units_sold": SALES[key]}
