"""Tables of the weather arena: literals only (read with ast.literal_eval, never run)."""

# LOCS: lower-case city: [location id, display name, lat, lon, time zone]
LOCS = {
    "bergen": ["LOC-60391", "Bergen, Norway", "60.39", "5.32", "Europe/Oslo"],
    "denver": ["LOC-39740", "Denver, USA", "39.74", "-104.99", "America/Denver"],
    "darwin": ["LOC-12462", "Darwin, Australia", "-12.46", "130.84", "Australia/Darwin"],
    "valencia": ["LOC-39470", "Valencia, Spain", "39.47", "-0.38", "Europe/Madrid"],
    "galway": ["LOC-53270", "Galway, Ireland", "53.27", "-9.05", "Europe/Dublin"],
    "kochi": ["LOC-09931", "Kochi, India", "9.93", "76.26", "Asia/Kolkata"],
}

# FORECASTS: location: {date: [condition, high, low, precip mm, wind kph]}
FORECASTS = {
    "LOC-60391": {
        "2025-04-17": ["overcast", "8.4", "3.9", "2.1", "22"],
        "2025-04-18": ["heavy rain", "9.1", "4.3", "14.2", "38"],
    },
    "LOC-39740": {"2025-01-11": ["clear and cold", "-2.0", "-13.5", "0.0", "31"]},
    "LOC-12462": {"2025-02-14": ["tropical cyclone", "29.8", "25.1", "212.6", "145"]},
    "LOC-39470": {"2025-10-29": ["torrential rain", "21.4", "16.2", "96.3", "47"]},
    "LOC-53270": {
        "2025-11-03": ["gale-force showers", "9.5", "6.0", "11.8", "71"],
        "2025-11-04": ["bright spells", "10.2", "5.1", "0.7", "29"],
    },
    "LOC-09931": {"2025-06-23": ["monsoon downpours", "28.6", "24.0", "118.4", "42"]},
}

STATIONS = {
    "LOC-60391": ["ST-BGO-07", "Bergen Florida", "1.2"],
    "LOC-39740": ["ST-DEN-14", "Denver Intl Airport", "18.6"],
    "LOC-12462": ["ST-DRW-02", "Darwin Airport", "6.4"],
    "LOC-39470": ["ST-VLC-11", "Valencia Viveros", "2.3"],
    "LOC-53270": ["ST-GWY-05", "Mace Head", "29.0"],
    "LOC-09931": ["ST-COK-03", "Kochi Naval Air Station", "4.8"],
}

# OBS: station: {date: [temp C, gust kph, humidity %, pressure hPa]}
OBS = {
    "ST-DEN-14": {"2025-01-11": ["-8.4", "87.5", "54", "1021.7"]},
    "ST-BGO-07": {"2025-04-18": ["7.6", "61.2", "97", "991.3"]},
    "ST-GWY-05": {"2025-11-03": ["8.9", "104.6", "88", "978.2"]},
    "ST-COK-03": {"2025-06-23": ["26.1", "55.0", "96", "1002.4"]},
}

ALERTS = {
    "LOC-12462": [
        ["AL-5521", "tropical cyclone warning", "extreme"],
        ["AL-5508", "heat advisory", "moderate"],
    ],
    "LOC-39470": [["AL-6130", "flash flood warning", "severe"]],
    "LOC-09931": [
        ["AL-7702", "heavy rainfall warning", "severe"],
        ["AL-7690", "coastal wind advisory", "minor"],
    ],
    "LOC-60391": [["AL-4410", "wind advisory", "minor"]],
}

# KNOWN: the ids of STATIONS, sorted (keep in step with STATIONS)
KNOWN = ["LOC-09931", "LOC-12462", "LOC-39470", "LOC-39740", "LOC-53270", "LOC-60391"]

# ALERT_INFO: alert: [headline, expires, zone]
ALERT_INFO = {
    "AL-5521": [
        "Cyclone Kirra expected to cross the coast near Darwin",
        "2025-02-15T06:00",
        "ZN-NT-214",
    ],
    "AL-5508": ["Heatwave conditions for the Top End", "2025-02-17T18:00", "ZN-NT-200"],
    "AL-6130": [
        "Flash flooding likely along the Turia and Poyo ravines",
        "2025-10-30T09:00",
        "ZN-VLC-031",
    ],
    "AL-7702": [
        "Extremely heavy rainfall over Ernakulam district",
        "2025-06-24T20:30",
        "ZN-KL-118",
    ],
    "AL-7690": ["Squally winds along the Kerala coast", "2025-06-24T08:00", "ZN-KL-102"],
    "AL-4410": ["Strong south-westerly winds in Vestland", "2025-04-18T21:00", "ZN-VL-006"],
}

# CENTERS: zone: [[center id, name, capacity, occupied]]
CENTERS = {
    "ZN-NT-214": [
        ["EC-2140", "Casuarina Secondary College", 650, 402],
        ["EC-2147", "Darwin Convention Centre", 1200, 933],
        ["EC-2152", "Palmerston Recreation Hall", 380, 377],
    ],
    "ZN-NT-200": [["EC-2001", "Nightcliff Community Hall", 240, 31]],
    "ZN-VLC-031": [
        ["EC-3101", "Pabellón Fuente de San Luis", 900, 512],
        ["EC-3108", "Colegio Público Benimaclet", 420, 96],
    ],
    "ZN-KL-118": [
        ["EC-1181", "Ernakulam Town Hall", 750, 610],
        ["EC-1186", "St. Teresa's School Hall", 520, 140],
        ["EC-1190", "Kaloor Indoor Stadium", 1500, 1187],
    ],
    "ZN-KL-102": [["EC-1020", "Fort Kochi Parish Hall", 300, 12]],
    "ZN-VL-006": [],
}

SUN = {
    "LOC-60391": ["06:12", "21:04"],
    "LOC-53270": ["07:41", "17:02"],
    "LOC-12462": ["06:48", "19:12"],
}

CLIMATE = {"bergen": "7.9", "galway": "8.6", "denver": "-0.4", "kochi": "27.4"}
