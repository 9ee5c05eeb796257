"""Adversarial checks: peer test-suite scenarios replayed through our API, and hostile inputs."""
