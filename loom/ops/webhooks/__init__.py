"""Signed webhooks: registration (registry.py), emitting events (events.py), delivery on
the worker pool (delivery.py). docs/webhooks.md describes the contract."""
