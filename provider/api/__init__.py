"""The daemon's HTTP API (FastAPI): tasks, results, vouchers, health, metrics."""

from provider.api.app import create_app

__all__ = ["create_app"]
