"""Contract cases of the hard attention layers (added to tests/cases.CASES)."""

CASES = []
