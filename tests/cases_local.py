"""Contract cases of the local attention layers (added to tests/cases.CASES)."""

CASES = []
