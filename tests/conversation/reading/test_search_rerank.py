"""conversation.search with `rerank: true`: the configured LLM (here an OpenAI-compatible
client talking to the local stand-in server) orders the hits; what it is sent, and
every reason it is not asked."""

from __future__ import annotations

import json

from loom.providers.llm import build_llm
from loom.store import namespaces
from tests.conversation.helpers import append_turn, ok
from tests.providers.standin import Reply, StandInServer

TURNS = [f"the ledger migration step {i} for the invoices" for i in range(6)]
QUERY = "ledger migration invoices"


def _reverse(srv: StandInServer):
    """The stand-in ranks the turns it is sent in reverse order."""

    def handle(req):
        turns = json.loads(req.json["messages"][-1]["content"])["turns"]
        return srv.chat_ok(json.dumps({"ranking": [t["id"] for t in reversed(turns)]}))

    return handle


async def test_the_llm_orders_the_hits_and_sees_only_the_query_and_excerpts(call, ns, writer, mint, services):
    for i, text in enumerate(TURNS):
        await append_turn(call, writer, ns, "default", "t", "user", text, msg_id=f"m{i}")
    await append_turn(
        call, writer, ns, "default", "t", "user", "ledger invoices: my PIN is 4821", msg_id="high"
    )
    viewer = mint(ns, "viewer")

    async def search(**kw):
        body = {"namespace": ns, "query": QUERY, "limit": 3, "search_mode": "hybrid", **kw}
        return await ok(call, "conversation.search", viewer, **body)

    plain = await search()
    assert plain["rerank"] is None
    # A re-rank gathers the 50 best; kept in the search's order, the page is their first 3.
    pool = (await search(limit=50))["hits"]
    first = pool[:3]
    # No model configured (the suite's stock fake): the order stays, and says why.
    unranked = await search(rerank=True)
    assert unranked["rerank"] == "llm_not_configured" and unranked["hits"] == first

    original = services.llm
    with StandInServer() as srv:
        srv.set_handler(srv.CHAT, _reverse(srv))
        services.llm = build_llm("openai", url=srv.url, model="stand-in")
        try:
            got = await search(rerank=True)
            assert got["rerank"] == "reranked"
            assert [h["msg_id"] for h in got["hits"]] == [h["msg_id"] for h in reversed(pool)][:3]
            (sent,) = srv.requests_to(srv.CHAT)
            body = json.loads(sent.json["messages"][-1]["content"])
            assert body["question"] == QUERY
            assert [t["text"] for t in body["turns"]] == [h["excerpt"] for h in pool]
            assert "PIN" not in sent.body.decode() and not any("m0" in t["id"] for t in body["turns"])

            srv.reset()
            srv.set_handler(srv.CHAT, Reply.error(500))
            failed = await search(rerank=True)
            assert failed["rerank"] == "llm_failed" and failed["hits"] == first
            high = await ok(
                call,
                "conversation.search",
                viewer,
                namespace=ns,
                query="my PIN is 4821",
                rerank=True,
                search_mode="lexical",
            )
            assert high["rerank"] == "query_high_sensitivity"

            srv.reset()
            namespaces.update(services.ch, ns, model_calls_enabled=False)
            closed = await search(rerank=True)
            assert closed["rerank"] == "model_calls_disabled" and closed["hits"] == first
            assert srv.requests_to(srv.CHAT) == []  # neither the failed-query nor the closed namespace asked
        finally:
            services.llm = original
            namespaces.update(services.ch, ns, model_calls_enabled=True)
