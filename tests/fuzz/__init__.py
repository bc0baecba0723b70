"""Mutation fuzzer over fusekit-written models (issue 12); see test_fuzz.py."""
