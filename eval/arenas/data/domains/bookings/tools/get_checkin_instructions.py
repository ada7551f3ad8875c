def get_checkin_instructions(confirmation_code):
    import re
    c = str(confirmation_code).strip().upper()
    if not re.fullmatch(r"CNF-[0-9A-F]{6}", c):
        return {"error": "unknown confirmation code " + str(confirmation_code)}
    return {"confirmation_code": c, "checkin_from": "15:00", "checkout_by": "11:00",
            "digital_key": _h("KEY", c),
            "note": "Show the digital key at the self check-in kiosk in the lobby."}
