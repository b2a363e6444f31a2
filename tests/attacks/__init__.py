"""The attack suite's helpers (tests/test_attacks.py): an attacker's episode, payloads, canaries."""
