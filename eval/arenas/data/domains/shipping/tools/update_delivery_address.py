def update_delivery_address(tracking_number, address):
    key = str(tracking_number).strip().upper()
    if key not in TRACKED:
        return {"error": "unknown tracking number " + str(tracking_number)}
    return {"tracking_number": key, "status": "address change requested",
            "address": str(address)}
