"""The Postgres + pgvector baseline: server lifecycle (postgres.py), SQL (sql.py), the FastAPI
app serving the four operations (app.py), and the harness target (target.py)."""
