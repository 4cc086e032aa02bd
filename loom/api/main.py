"""`uvicorn loom.api.main:app`: the app configured from the environment."""

from loom.api.app import create_app

app = create_app()
