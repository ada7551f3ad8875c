"""The runtime of the general families' tools (families.py): this module's text is the head of
every such tool's source, run in the arena sandbox, and the generator imports it to compute the
gold answers, so both sides normalise and hash with the same code. Standard Python only, no
imports.

A tool checks and normalises its arguments against its ``SPEC`` (:func:`norm`: text trimmed,
spaces collapsed and case-folded; numbers of the right type and range, floats to 2 decimals;
dates ``YYYY-MM-DD``, times ``HH:MM``; enum members; unordered lists sorted; objects with their
declared fields), then answers with its status, a receipt (:func:`receipt`, a hash of the
normalised arguments: other arguments give another receipt) and a batch code (:func:`batch`,
the hash of every distinct valid call of this tool in the episode so far, in any order: the
answer of a task that calls one function several times). A bad argument is an error that names
it and says what was expected; it never holds a receipt.
"""

RECEIPT_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
RECEIPT_SALT = "astra-procedural-receipt-v1"
_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class BadArgument(ValueError):
    """An argument the tool cannot take: the message names it and what was expected."""


def receipt(text: str) -> str:
    """A 6-character code of ``text`` (64-bit FNV-1a, base 32 without look-alike characters)."""
    h = 0xCBF29CE484222325
    for byte in (RECEIPT_SALT + "|" + text).encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    out = ""
    for _ in range(6):
        out += RECEIPT_ALPHABET[h % 32]
        h //= 32
    return out


def batch(name: str, keys: list[str]) -> str:
    """The code of a set of calls of ``name`` (their normalised arguments), order aside."""
    return receipt(name + "|batch|" + "|".join(sorted(set(keys))))


def _is_date(v: str) -> bool:
    if len(v) != 10 or v[4] != "-" or v[7] != "-" or not (v[:4] + v[5:7] + v[8:]).isdigit():
        return False
    month, day = int(v[5:7]), int(v[8:])
    return 1 <= month <= 12 and 1 <= day <= _DAYS[month - 1]


def _is_time(v: str) -> bool:
    if len(v) != 5 or v[2] != ":" or not (v[:2] + v[3:]).isdigit():
        return False
    return int(v[:2]) < 24 and int(v[3:]) < 60


def _number(spec: dict, value: object, path: str, integral: bool) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integral and isinstance(value, float) and not value.is_integer())
    ):
        raise BadArgument(f"{path}: expected {'an integer' if integral else 'a number'}")
    number = float(value)
    lo, hi = spec.get("min"), spec.get("max")
    if not ((lo is None or number >= lo) and (hi is None or number <= hi)):
        raise BadArgument(f"{path}: expected a value from {lo:g} to {hi:g}")
    return number


def _text(value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadArgument(f"{path}: expected a non-empty string")
    return value


def _list(spec: dict, value: object, path: str) -> list:
    lo, hi = spec["min_items"], spec["max_items"]
    if not isinstance(value, list) or not lo <= len(value) <= hi:
        raise BadArgument(f"{path}: expected a list of {lo} to {hi} items")
    items = [norm(spec["items"], v, f"{path}[{i}]") for i, v in enumerate(value)]
    return items if spec.get("ordered") else sorted(items, key=repr)


def _object(spec: dict, value: object, path: str) -> list:
    if not isinstance(value, dict):
        raise BadArgument(f"{path}: expected an object")
    fields = {f["name"]: f for f in spec["fields"]}
    unknown = sorted(str(k) for k in value if k not in fields)
    if unknown:
        raise BadArgument(f"{path}: unknown field(s) {', '.join(unknown)}")
    missing = sorted(k for k in fields if k not in value)
    if missing:
        raise BadArgument(f"{path}: missing field(s) {', '.join(missing)}")
    return [[k, norm(fields[k], value[k], f"{path}.{k}")] for k in sorted(fields)]


def norm(spec: dict, value: object, path: str) -> object:
    """The canonical form of ``value`` for a parameter ``spec``; BadArgument if it is not one."""
    kind = spec["type"]
    if kind == "text":
        return " ".join(_text(value, path).split()).casefold()
    if kind in ("int", "float"):
        number = _number(spec, value, path, kind == "int")
        return int(number) if kind == "int" else f"{number:.2f}"
    if kind == "bool":
        if not isinstance(value, bool):
            raise BadArgument(f"{path}: expected true or false")
        return value
    if kind == "enum":
        folded = value.casefold() if isinstance(value, str) else None
        if folded not in [v.casefold() for v in spec["values"]]:
            raise BadArgument(f"{path}: expected one of {', '.join(spec['values'])}")
        return folded
    if kind == "date":
        if not _is_date(_text(value, path)):
            raise BadArgument(f"{path}: expected a date as YYYY-MM-DD")
        return value
    if kind == "time":
        if not _is_time(_text(value, path)):
            raise BadArgument(f"{path}: expected a 24-hour time as HH:MM")
        return value
    if kind == "list":
        return _list(spec, value, path)
    if kind == "object":
        return _object(spec, value, path)
    raise BadArgument(f"{path}: unknown type {kind}")


def canonical(spec: dict, args: dict) -> str:
    """The normalised arguments of a call as one string (an optional parameter left out, or
    given as null, counts as its default)."""
    out = []
    for p in spec["params"]:
        value = args.get(p["name"])
        if value is None and "default" in p:
            out.append(None if p["default"] is None else norm(p, p["default"], p["name"]))
        else:
            out.append(norm(p, value, p["name"]))
    return repr(out)


def answer(spec: dict, seen: list, args: dict) -> dict:
    """The tool's reply to a call with ``args``; ``seen`` holds this episode's valid calls."""
    try:
        key = canonical(spec, args)
    except BadArgument as exc:
        return {"error": f"invalid argument {exc}"}
    if key not in seen:
        seen.append(key)
    return {
        "status": spec["status"],
        spec["receipt"]: receipt(spec["name"] + "|" + key),
        "batch": batch(spec["name"], seen),
        "calls_in_batch": len(seen),
    }
