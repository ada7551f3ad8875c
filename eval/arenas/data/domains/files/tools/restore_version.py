def restore_version(file_id, version_id):
    key, ver = str(file_id).strip().upper(), str(version_id).strip().upper()
    if ver not in [v[0] for v in VERSIONS.get(key, [])]:
        return {"error": "version " + str(version_id) + " not found for file " + str(file_id)}
    return {"restore_id": _h("RST", key, ver), "file_id": key, "restored_version": ver,
            "status": "restored"}
