"""The brief model over the real OpenAI-compatible provider, against the local stand-in
server: good answers, malformed answers, errors and timeouts."""

from __future__ import annotations

import pytest

from loom.errors import Unavailable
from loom.providers.llm import ScriptedLLM
from tests.briefs.helpers import answer, brief_get, brief_save, ev, notes
from tests.providers.standin import Reply, StandInServer

pytestmark = pytest.mark.timeout(60)


def brief_model_svc(make_svc, srv: StandInServer, **extra):
    return make_svc(
        session_brief_llm_model="brief-model",
        session_brief_llm_api_key="brief-key",
        llm_url=srv.url,
        llm_timeout_seconds=0.5,
        session_brief_window_chars=2_000,
        **extra,
    )


async def test_good_answers_from_the_brief_model(make_svc, standin, ns, who):
    standin.chat_reply = answer(goal="Stream the exporter", status="windowed", new_decisions=["use COPY"])
    svc = brief_model_svc(make_svc, standin)
    r = await brief_save(svc, who(ns), ns, brief_key="k", events=notes(50))
    assert (r.author, r.windows, r.windows_revised) == ("llm", 3, 3)
    sent = standin.requests_to(standin.CHAT)
    assert len(sent) == 3
    assert all(req.json["model"] == "brief-model" and req.bearer == "brief-key" for req in sent)
    assert sent[0].json["temperature"] == 0.0 and sent[0].json["messages"][0]["role"] == "system"
    got = await brief_get(svc, who(ns), ns, brief_key="k")
    assert got.sections.goal == "Stream the exporter" and got.sections.decisions == ["use COPY"]


async def test_malformed_error_and_timeout_windows_are_skipped(make_svc, standin, ns, who):
    svc = brief_model_svc(make_svc, standin)
    standin.enqueue(
        standin.CHAT,
        standin.chat_ok(answer(status="w1", new_done=["one"])),
        Reply.malformed(),  # not JSON at all
        standin.chat_ok("Sure! Here is your brief: goal = faster"),  # off contract
        Reply.error(500, "overloaded"),
        standin.chat_ok(answer(status="late")).delayed(2.0),  # past the 0.5 s timeout
        standin.chat_ok(answer(status="w6", new_done=["six"])),
    )
    r = await brief_save(
        svc,
        who(ns),
        ns,
        brief_key="k",
        events=notes(120),
        settings=svc.settings.model_copy(update={"session_brief_max_windows": 6}),
    )
    assert (r.windows, r.windows_revised, r.windows_failed) == (6, 2, 4)
    got = await brief_get(svc, who(ns), ns, brief_key="k")
    assert got.sections.status == "w6" and got.sections.done == ["one", "six"]


async def test_every_window_failing_over_http_is_503(make_svc, standin, ns, who):
    svc = brief_model_svc(make_svc, standin)
    standin.set_handler(standin.CHAT, Reply.error(502, "bad gateway"))
    with pytest.raises(Unavailable):
        await brief_save(svc, who(ns), ns, brief_key="k", events=notes(30))
    assert len(standin.requests_to(standin.CHAT)) == 2


async def test_without_the_key_the_deployment_llm_writes(make_svc, standin, ns, who):
    deployment = ScriptedLLM(lambda msgs: answer(status="from the deployment LLM"))
    svc = make_svc(
        llm=deployment,
        session_brief_llm_model="brief-model",
        session_brief_llm_api_key="",
        llm_url=standin.url,
    )
    r = await brief_save(svc, who(ns), ns, brief_key="k", events=[ev("note", "hello")])
    assert r.author == "llm" and len(deployment.calls) == 1 and deployment.calls[0].model is None
    assert standin.requests_to(standin.CHAT) == []
    # LOOM_SESSION_BRIEF_LLM off: no model for briefs at all, so the deterministic builder.
    off = make_svc(llm=deployment, session_brief_llm=False)
    r = await brief_save(off, who(ns), ns, brief_key="k2", events=[ev("user", "Write the release notes")])
    assert r.author == "deterministic" and len(deployment.calls) == 1
