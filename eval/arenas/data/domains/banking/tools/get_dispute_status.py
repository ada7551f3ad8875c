def get_dispute_status(case_id):
    import re
    c = str(case_id).strip().upper()
    if not re.fullmatch(r"DSP-[0-9A-F]{6}", c):
        return {"error": "unknown dispute case " + str(case_id)}
    return {"case_id": c, "status": "provisional credit issued",
            "credit_reference": _h("PCR", c), "decision_due_days": 10}
