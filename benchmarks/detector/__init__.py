"""The ground-truth suite for abwatch's regression detector: `python -m benchmarks.detector`."""
