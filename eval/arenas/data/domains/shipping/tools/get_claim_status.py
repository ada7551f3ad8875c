def get_claim_status(claim_id):
    import re
    c = str(claim_id).strip().upper()
    if not re.fullmatch(r"CLM-[0-9A-F]{6}", c):
        return {"error": "unknown claim " + str(claim_id)}
    return {"claim_id": c, "status": "approved", "payout_reference": _h("PAY", c),
            "payout_in_days": 5}
