def book_room(quote_id, guest_name):
    import re
    q = str(quote_id).strip().upper()
    if not re.fullmatch(r"QT-[0-9A-F]{6}", q):
        return {"error": "unknown quote id " + str(quote_id)}
    g = " ".join(str(guest_name).split())
    if not g:
        return {"error": "guest_name is required"}
    return {"confirmation_code": _h("CNF", q, g), "quote_id": q, "guest_name": g,
            "status": "confirmed"}
