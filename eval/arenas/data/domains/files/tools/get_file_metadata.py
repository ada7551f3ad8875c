def get_file_metadata(file_id):
    key = str(file_id).strip().upper()
    v = FILES.get(key)
    if v is None:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "path": v[0], "size_bytes": v[1], "owner_id": v[2],
            "modified": v[3], "sha256": v[4]}
