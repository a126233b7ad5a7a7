"""Tests that run the jobs on a real Spark standalone cluster on this machine."""
