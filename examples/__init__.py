"""Runnable examples and the small tasks and models that scripts and tests share."""
