import hashlib


def _h(prefix, *parts):
    raw = "|".join(str(p).strip().lower() for p in parts)
    return prefix + "-" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:6].upper()
