"""Prometheus exposition for rankwatch: custom collectors and the HTTP endpoint."""
