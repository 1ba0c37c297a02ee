"""Replay: find the probes a user added, decide which blocks must run, run, and check the result."""
