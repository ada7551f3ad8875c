"""Tables of the files arena: literals only (read with ast.literal_eval, never run)."""

# FILES: id: [path, size bytes, owner, modified, sha256]
FILES = {
    "F-3C91": [
        "/finance/2024/budget_2024.xlsx",
        482113,
        "U-207",
        "2025-02-11T09:14",
        "9f2c41d0ab7e5c3318e0d7a64b21f90c55d1e8a3b6c7f4029d8e1a5b3c7d9e0f",
    ],
    "F-9A61": [
        "/finance/2023/budget_2023.xlsx",
        455020,
        "U-207",
        "2024-02-02T16:40",
        "1b7d33e0c9a24f6b8e51d0c7a3f92e46b5d8c1e07a9f3b26d4e8c5a1f0b7d392",
    ],
    "F-4A07": [
        "/ops/runbooks/deploy.md",
        6120,
        "U-142",
        "2025-03-04T11:20",
        "c04e7a19d2b85f3e6a1c9d07b4e2f85a3c6d9e10b7a4f2c58e1d3b6a9c0f7e24",
    ],
    "F-5B12": [
        "/team/notes/handover.txt",
        812,
        "U-207",
        "2025-03-28T18:05",
        "5e8a2c71f0b3d94e6c1a7b58d2e0f93c4a6b1d8e7f2c05a93b6d4e1c8a7f0b25",
    ],
    "F-8D20": [
        "/finance/q3/q3_numbers.xlsx",
        220947,
        "U-311",
        "2025-03-27T10:31",
        "e71c4b9a0d35f82c6e4a1b97d0c3f58e2a6d9b14c7e0f3a85d2b6c9e1a4f7d03",
    ],
    "F-6E44": [
        "/legal/templates/nda_template.docx",
        58233,
        "U-188",
        "2025-01-20T08:30",
        "a3d6f91c4e07b82d5c1e9a64f0b3d7c28e5a1f96d4c0b7e32a8f5d1c9e6b04a7",
    ],
    "F-7F58": [
        "/design/brand/logo_final.svg",
        14870,
        "U-265",
        "2025-03-18T17:02",
        "70bd2e5c8a41f9d3e6c0b7a25d8f14e9c3a6b0d72e5f8c1a94d7b3e6f0c2a58d",
    ],
    "F-2D33": [
        "/ops/config/app.yaml",
        1904,
        "U-142",
        "2025-03-30T07:45",
        "d9c2a7e41b6f08d3c5e9a2b74f1d6c08e3a5b9f27d4c1e06a8b3f5d92c7e4a10",
    ],
}

CONTENTS = {
    "F-5B12": "Handover, week 13.\nBudget review moved to Thursday.\nThe final Q3 figures live in file F-8D20 (q3_numbers.xlsx); check with its owner before editing.\n",
    "F-4A07": "# Deploy runbook\n1. Freeze merges.\n2. Run the canary for 30 minutes.\n",
    "F-2D33": "service: billing-api\nreplicas: 4\nlog_level: info\n",
}

# USERS: id: [name, email, team]
USERS = {
    "U-207": ["Irene Salo", "irene.salo@northwind.example", "Finance"],
    "U-311": ["Kwame Osei", "kwame.osei@northwind.example", "Finance"],
    "U-188": ["Beatriz Lima", "beatriz.lima@northwind.example", "Legal"],
    "U-265": ["Noah Brandt", "noah.brandt@northwind.example", "Design"],
    "U-199": ["Omar Haddad", "omar.haddad@northwind.example", "Design"],
    "U-142": ["Sofia Marin", "sofia.marin@northwind.example", "Platform"],
    "U-233": ["Lena Vogt", "lena.vogt@northwind.example", "Legal"],
}

# VERSIONS: file: [[version id, saved at, author]], newest first
VERSIONS = {
    "F-7F58": [
        ["V-1187", "2025-03-18T17:02", "U-265"],
        ["V-1142", "2025-03-11T10:45", "U-199"],
        ["V-1090", "2025-02-26T09:12", "U-265"],
        ["V-1013", "2025-01-30T15:38", "U-199"],
    ],
    "F-6E44": [
        ["V-2290", "2025-01-20T08:30", "U-188"],
        ["V-2216", "2024-11-05T14:12", "U-188"],
        ["V-2141", "2024-06-19T11:00", "U-233"],
    ],
    "F-2D33": [
        ["V-3375", "2025-03-30T07:45", "U-142"],
        ["V-3352", "2025-03-12T13:20", "U-142"],
        ["V-3318", "2025-01-27T16:55", "U-142"],
        ["V-3301", "2024-12-09T10:02", "U-142"],
    ],
    "F-4A07": [["V-4032", "2025-03-04T11:20", "U-142"]],
}

# EMAILS: the emails of USERS, sorted (keep in step with USERS)
EMAILS = [
    "beatriz.lima@northwind.example",
    "irene.salo@northwind.example",
    "kwame.osei@northwind.example",
    "lena.vogt@northwind.example",
    "noah.brandt@northwind.example",
    "omar.haddad@northwind.example",
    "sofia.marin@northwind.example",
]

# IDS: the ids of FILES, sorted (keep in step with FILES)
IDS = ["F-2D33", "F-3C91", "F-4A07", "F-5B12", "F-6E44", "F-7F58", "F-8D20", "F-9A61"]

QUOTA = {"U-207": ["41.2", "100"], "U-142": ["12.8", "50"]}
