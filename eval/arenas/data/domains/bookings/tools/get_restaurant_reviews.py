def get_restaurant_reviews(city):
    rows = REVIEWS.get(str(city).strip().lower())
    if rows is None:
        return {"error": "no reviews for " + str(city)}
    return {"city": str(city), "restaurants": [{"name": n, "stars": s} for n, s in rows]}
