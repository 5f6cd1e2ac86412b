"""Helpers shared by the test suites (real Prometheus/Pushgateway processes, ...)."""
