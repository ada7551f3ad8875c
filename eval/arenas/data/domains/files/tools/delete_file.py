def delete_file(file_id):
    key = str(file_id).strip().upper()
    if key not in IDS:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "status": "moved to trash"}
