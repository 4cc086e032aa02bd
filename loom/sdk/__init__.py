"""The Python client: `from loom import Agent` (agent.py); every op typed (ops.py); the HTTP transport (transport.py); transcript files (transcripts.py); a blocking facade (sync.py)."""
