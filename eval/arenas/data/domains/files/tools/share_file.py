def share_file(file_id, email, permission):
    key = str(file_id).strip().upper()
    if key not in FILES:
        return {"error": "unknown file id " + str(file_id)}
    mail = str(email).strip().lower()
    if mail not in EMAILS:
        return {"error": str(email) + " is not in the company directory"}
    perm = str(permission).strip().lower()
    if perm not in ("view", "edit"):
        return {"error": "permission must be view or edit"}
    return {"share_id": _h("SHR", key, mail, perm), "file_id": key, "shared_with": mail,
            "permission": perm}
