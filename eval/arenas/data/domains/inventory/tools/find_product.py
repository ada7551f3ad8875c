def find_product(query):
    words = str(query).lower().split()
    if not words:
        return {"error": "empty query"}
    hits = [{"sku": s, "name": p[0], "category": p[1]} for s, p in PRODUCTS.items()
            if all(w in p[0].lower() for w in words)]
    if not hits:
        return {"error": "no product matches " + str(query)}
    return {"matches": hits}
