def list_versions(file_id):
    key = str(file_id).strip().upper()
    if key not in FILES:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "versions": [{"version_id": v, "saved": t, "author_id": a}
                                         for v, t, a in VERSIONS.get(key, [])]}
