"""Summarization (in progress): the pointer-generator model; the task comes next."""
