"""Question answering: memory networks over stories (bAbI-style tasks)."""
