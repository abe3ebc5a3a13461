"""The analyzer: pure functions from kernel records to verdicts."""
