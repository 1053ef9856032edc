"""Workflows built on the probes: CI gates, model-family scans, the rescaling-invariance check,
and the result files and statistics they share."""
