def move_file(file_id, destination):
    key = str(file_id).strip().upper()
    if key not in IDS:
        return {"error": "unknown file id " + str(file_id)}
    return {"file_id": key, "folder": str(destination), "status": "moved"}
