from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def test_compose_parses_with_the_services():
    doc = yaml.safe_load(COMPOSE.read_text())
    assert {"clickhouse", "redis", "api", "worker", "migrate"} <= set(doc["services"])
    env = doc["services"]["api"]["environment"]
    assert env["LOOM_CLICKHOUSE_URL"].startswith("http://clickhouse:")
    assert env["LOOM_REDIS_URL"].startswith("redis://redis:")
    assert doc["services"]["worker"]["command"] == ["loom", "worker"]
