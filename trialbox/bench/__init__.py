"""Benchmarks run by `make bench` (`trialbox bench …`)."""
