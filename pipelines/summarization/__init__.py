"""Summarization: the pointer-generator network with coverage (See et al. 2017)."""
