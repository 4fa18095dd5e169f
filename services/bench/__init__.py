"""Benchmarks that print ratios against baselines measured in the same run."""
