"""The HTTP API (CONTRACT.md section 3), DRF views calling ``checkpoints.services``."""
