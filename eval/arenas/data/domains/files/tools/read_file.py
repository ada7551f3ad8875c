def read_file(file_id):
    key = str(file_id).strip().upper()
    if key not in FILES:
        return {"error": "unknown file id " + str(file_id)}
    if key not in CONTENTS:
        return {"error": FILES[key][0] + " is a binary file and cannot be read as text"}
    return CONTENTS[key]
