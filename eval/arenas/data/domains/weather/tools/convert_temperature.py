def convert_temperature(value, from_unit, to_unit):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return {"error": "value must be a number"}
    a, b = str(from_unit).upper(), str(to_unit).upper()
    to_c = {"C": lambda x: x, "F": lambda x: (x - 32) * 5 / 9, "K": lambda x: x - 273.15}
    from_c = {"C": lambda x: x, "F": lambda x: x * 9 / 5 + 32, "K": lambda x: x + 273.15}
    if a not in to_c or b not in from_c:
        return {"error": "units must be C, F or K"}
    return {"value": "%.1f" % from_c[b](to_c[a](v)), "unit": b}
