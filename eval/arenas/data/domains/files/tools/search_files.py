def search_files(name):
    q = str(name).strip().lower()
    if not q:
        return {"error": "empty file name"}
    hits = [{"file_id": k, "path": v[0]} for k, v in FILES.items()
            if q in v[0].rsplit("/", 1)[-1].lower()]
    if not hits:
        return {"error": "no file named like " + str(name)}
    return {"matches": hits}
