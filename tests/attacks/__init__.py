"""The attack suite's helpers (tests/sandbox/test_attacks.py): an attacker's episode, payloads, canaries."""
