"""Extractive question answering: a passage and a question in, the answer's span out."""
