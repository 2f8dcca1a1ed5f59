"""Summarization (in progress): the pointer-generator model and its in-graph
decoding; the task comes next."""
