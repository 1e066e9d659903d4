"""Helpers that are not part of the paper's model."""
