"""Measurement suites that back abwatch's published numbers (not part of the service)."""
