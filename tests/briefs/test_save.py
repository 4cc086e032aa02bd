"""session.brief_save and friends at the op level, on the real backends."""

from __future__ import annotations

import asyncio
import json

import pytest

from loom.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unavailable
from loom.models.session import BriefSaveResponse
from loom.providers.llm import LLMError, ScriptedLLM
from loom.store import namespaces as ns_store
from tests.briefs.helpers import answer, brief_delete, brief_get, brief_list, brief_save, ev, notes

pytestmark = pytest.mark.timeout(60)

CODING = [
    ev("user", "Add retries with backoff to the upload client"),
    ev("edit", "retry loop", path="loom/sdk/upload.py"),
    ev("command", "pytest -q", exit_code=0),
    ev("summary", "We added a retry loop to the upload client; tests pass."),
    ev("assistant", "Done: retries are in."),
]


async def test_deterministic_builder_without_any_llm(services, ns, who):
    w = who(ns)
    r = await brief_save(services, w, ns, project="loom", branch="retries", session_id="s1", events=CODING)
    assert (r.changed, r.author, r.revision, r.brief_key) == (True, "deterministic", 1, "auto/loom/retries")
    assert r.summary_kept and r.windows == 0
    got = await brief_get(services, w, ns, brief_key="auto/loom/retries")
    assert got.sections.goal == "Add retries with backoff to the upload client"
    assert got.sections.key_files == ["loom/sdk/upload.py"]
    assert got.sections.decisions == [] and got.sections.dead_ends == []
    assert got.text.startswith("# Session brief: auto/loom/retries (revision 1)")
    assert got.author == "deterministic" and got.summary is None


@pytest.mark.parametrize("switch", ["use_llm", "model_calls", "policy"])
async def test_events_alone_with_no_model_to_call_are_not_revised(services, make_svc, ns, who, switch):
    llm = ScriptedLLM([answer(goal="never")])
    svc = make_svc(llm=llm)
    kwargs = {"use_llm": switch != "use_llm"}
    if switch == "model_calls":
        ns_store.update(services.ch, ns, model_calls_enabled=False)
    if switch == "policy":
        ns_store.update(services.ch, ns, extraction_policy="operator: no server-side extraction")
    w = who(ns)
    r = await brief_save(svc, w, ns, brief_key="k", events=CODING, **kwargs)
    assert (r.changed, r.reason, r.revision, r.author) == (False, "not-revised", 0, None)
    assert llm.calls == []
    with pytest.raises(NotFound):
        await brief_get(svc, w, ns, brief_key="k")
    # The same switch on the fake-LLM deployment: the builder does not run either.
    r = await brief_save(services, w, ns, brief_key="k", events=CODING, **kwargs)
    assert r.reason == "not-revised"
    # With the agent's sections: those are written over the brief, nothing from the events.
    r = await brief_save(
        svc, w, ns, brief_key="k", events=CODING, sections={"goal": "From the agent"}, **kwargs
    )
    assert (r.changed, r.author, r.revision, r.summary_kept) == (True, "model", 1, False)
    got = await brief_get(svc, w, ns, brief_key="k", full=True)
    assert (
        got.sections.goal == "From the agent" and got.sections.status == "" and got.sections.key_files == []
    )
    assert got.summary is None and llm.calls == []


async def test_window_count_and_cap(make_svc, ns, who):
    llm = ScriptedLLM(lambda msgs: answer(status=f"call {len(llm.calls)}"))
    svc = make_svc(llm=llm, session_brief_window_chars=2_000, session_brief_max_windows=4)
    r = await brief_save(svc, who(ns), ns, brief_key="w", events=notes(50))  # 2.5 windows
    assert (r.windows, r.windows_revised, r.windows_failed, r.author) == (3, 3, 0, "llm")
    assert len(llm.calls) == 3
    assert ["window 1 of 3" in c.messages[1].content for c in llm.calls] == [True, False, False]

    llm2 = ScriptedLLM(lambda msgs: answer(status="capped"))
    svc2 = make_svc(llm=llm2, session_brief_window_chars=2_000, session_brief_max_windows=2)
    r = await brief_save(svc2, who(ns), ns, brief_key="w2", events=notes(100))  # 5 windows
    assert (r.windows, r.windows_revised, r.events_dropped) == (5, 2, 60)
    assert len(llm2.calls) == 2
    assert "n0099" in llm2.calls[-1].messages[1].content and "n0059" not in llm2.calls[0].messages[1].content


async def test_a_failed_middle_window_is_skipped(make_svc, ns, who):
    llm = ScriptedLLM(
        [
            answer(status="after 1", new_decisions=["d1"]),
            LLMError("boom"),
            answer(status="after 3", new_decisions=["d3"]),
        ]
    )
    svc = make_svc(llm=llm, session_brief_window_chars=2_000)
    r = await brief_save(svc, who(ns), ns, brief_key="m", events=notes(50))
    assert (r.windows, r.windows_revised, r.windows_failed, r.changed) == (3, 2, 1, True)
    got = await brief_get(svc, who(ns, "viewer"), ns, brief_key="m")
    assert got.sections.status == "after 3" and got.sections.decisions == ["d1", "d3"]
    # window 3 was asked with window 1's revision
    assert '"after 1"' in llm.calls[2].messages[1].content


async def test_every_window_failed_is_503_and_writes_nothing(make_svc, ns, who):
    llm = ScriptedLLM([LLMError("down"), "not json at all", RuntimeError("crash")])
    svc = make_svc(llm=llm, session_brief_window_chars=2_000)
    with pytest.raises(Unavailable) as exc:
        await brief_save(svc, who(ns), ns, brief_key="f", events=notes(50))
    assert exc.value.status == 503 and exc.value.extra["windows_failed"] == 3
    with pytest.raises(NotFound):
        await brief_get(svc, who(ns), ns, brief_key="f")
    # With sections, those are written over the brief as it was.
    llm2 = ScriptedLLM([LLMError("down")])
    svc2 = make_svc(llm=llm2)
    r = await brief_save(svc2, who(ns), ns, brief_key="f", events=CODING, sections={"next_steps": ["retry"]})
    assert (r.changed, r.author, r.windows_failed, r.summary_kept) == (True, "model", 1, False)


async def test_switched_off_after_a_window_keeps_it(services, make_svc, ns, who):
    def first_then_off(msgs):
        if len(llm.calls) == 1:
            ns_store.update(services.ch, ns, model_calls_enabled=False)
        return answer(status=f"window {len(llm.calls)}", new_done=[f"w{len(llm.calls)}"])

    llm = ScriptedLLM(first_then_off)
    svc = make_svc(llm=llm, session_brief_window_chars=2_000)
    r = await brief_save(svc, who(ns), ns, brief_key="s", events=notes(50))
    assert (r.windows, r.windows_revised, r.changed, len(llm.calls)) == (3, 1, True, 1)
    got = await brief_get(svc, who(ns), ns, brief_key="s")
    assert got.sections.done == ["w1"]


async def test_accumulate_vs_replace_over_saves(make_svc, ns, who):
    llm = ScriptedLLM(
        [
            answer(
                goal="G",
                status="s1",
                next_steps=["a", "b"],
                new_decisions=["d1"],
                new_dead_ends=["x1"],
                new_done=["o1"],
            ),
            answer(status="s2", next_steps=["c"], new_decisions=["d2"], new_done=["o2"]),
        ]
    )
    svc = make_svc(llm=llm)
    w = who(ns)
    await brief_save(svc, w, ns, brief_key="a", events=[ev("note", "one")])
    await brief_save(svc, w, ns, brief_key="a", events=[ev("note", "two")])
    s = (await brief_get(svc, w, ns, brief_key="a")).sections
    assert (s.goal, s.status, s.next_steps) == ("G", "s2", ["c"])
    assert (s.decisions, s.dead_ends, s.done) == (["d1", "d2"], ["x1"], ["o1", "o2"])


async def test_caps_hold_over_many_saves(make_svc, ns, who):
    w = who(ns)
    svc = make_svc()
    for i in range(25):
        await brief_save(
            svc,
            w,
            ns,
            brief_key="c",
            sections={
                "decisions": [f"decision {i}"],
                "dead_ends": [f"dead end {i}"],
                "next_steps": [f"step {i}.{j}" for j in range(10)],
            },
        )
    got = await brief_get(svc, w, ns, brief_key="c")
    s = got.sections
    assert len(s.decisions) == 20 and s.decisions[0] == "decision 5" and s.decisions[-1] == "decision 24"
    assert len(s.dead_ends) == 12 and s.dead_ends[0] == "dead end 13"
    assert len(s.next_steps) == 8
    assert got.revision == 25 and len(got.text) < 12_000


async def test_retry_is_a_no_op(services, ns, who):
    w = who(ns)
    r1 = await brief_save(services, w, ns, brief_key="r", session_id="s1", event_cursor="c7", events=CODING)
    assert r1.revision == 1
    again = await brief_save(
        services, w, ns, brief_key="r", session_id="s1", event_cursor="c7", events=CODING, if_revision=0
    )  # a retried CAS save is not a 409
    assert (again.changed, again.reason, again.revision) == (False, "retry", 1)
    other = await brief_save(
        services,
        w,
        ns,
        brief_key="r",
        session_id="s2",
        event_cursor="c7",
        events=[ev("note", "another session")],
    )
    assert other.changed and other.revision == 2


async def test_if_revision_conflict_and_concurrent_saves(services, ns, who):
    w = who(ns)
    await brief_save(services, w, ns, brief_key="cas", sections={"goal": "start"})
    with pytest.raises(Conflict) as exc:
        await brief_save(services, w, ns, brief_key="cas", sections={"goal": "x"}, if_revision=3)
    assert exc.value.status == 409 and exc.value.extra["current_revision"] == 1
    with pytest.raises(Conflict):
        await brief_save(services, w, ns, brief_key="new-one", sections={"goal": "x"}, if_revision=1)

    for rev in (1, 2, 3):  # two concurrent saves with the same if_revision: exactly one wins, every round
        results = await asyncio.gather(
            *(
                brief_save(
                    services, w, ns, brief_key="cas", sections={"goal": f"r{rev} writer {i}"}, if_revision=rev
                )
                for i in range(2)
            ),
            return_exceptions=True,
        )
        wins = [r for r in results if isinstance(r, BriefSaveResponse)]
        losses = [r for r in results if isinstance(r, Conflict)]
        assert len(wins) == 1 and len(losses) == 1, results
        assert wins[0].revision == rev + 1 and losses[0].extra["current_revision"] == rev + 1
        got = await brief_get(services, w, ns, brief_key="cas")
        assert got.revision == rev + 1 and got.sections.goal in (f"r{rev} writer 0", f"r{rev} writer 1")


async def test_concurrent_saves_without_cas_lose_nothing(services, ns, who):
    w = who(ns)
    await asyncio.gather(
        *(brief_save(services, w, ns, brief_key="many", sections={"done": [f"item {i}"]}) for i in range(6))
    )
    got = await brief_get(services, w, ns, brief_key="many")
    assert got.revision == 6 and sorted(got.sections.done) == [f"item {i}" for i in range(6)]


async def test_revision_n_and_full(services, ns, who):
    w = who(ns)
    await brief_save(
        services,
        w,
        ns,
        brief_key="h",
        events=[ev("user", "Make the exporter stream rows"), ev("summary", "SUMMARY ONE\nverbatim  spacing")],
    )
    await brief_save(services, w, ns, brief_key="h", sections={"goal": "Stream rows, then gzip"})
    await brief_save(services, w, ns, brief_key="h", events=[ev("summary", "SUMMARY TWO")])
    first = await brief_get(services, w, ns, brief_key="h", revision=1, full=True)
    assert (first.revision, first.latest_revision) == (1, 3)
    assert first.sections.goal == "Make the exporter stream rows"
    assert first.summary == "SUMMARY ONE\nverbatim  spacing"
    assert first.text.endswith("## Last compaction summary (verbatim)\n\nSUMMARY ONE\nverbatim  spacing\n")
    latest = await brief_get(services, w, ns, brief_key="h", full=True)
    assert latest.revision == 3 and latest.sections.goal == "Stream rows, then gzip"
    assert latest.summary == "SUMMARY TWO" and latest.text.index("## Goal") < latest.text.index("SUMMARY TWO")
    plain = await brief_get(services, w, ns, brief_key="h")
    assert plain.summary is None and "## Last compaction summary" not in plain.text
    with pytest.raises(NotFound) as exc:
        await brief_get(services, w, ns, brief_key="h", revision=9)
    assert exc.value.field == "revision"


async def test_high_sensitivity_never_reaches_the_model(services, make_svc, ns, who):
    secret_key = "sk-proj-Xk9fQ2mZ7pL4vB8nR1tY6wE3uI0oA5sD"
    llm = ScriptedLLM(lambda msgs: answer(status="ok"))
    svc = make_svc(llm=llm, session_brief_window_chars=2_000)
    w = who(ns)
    await brief_save(svc, w, ns, brief_key="hs", sections={"constraints": ["password=s3cr3tP4ss"]})
    events = [
        ev("user", "rotate the deploy key"),
        ev("command", f"export OPENAI_API_KEY={secret_key}"),
        ev("note", "my PIN is 4821"),
        ev("summary", "SSN 536-90-4399"),
        *notes(30),
    ]
    r = await brief_save(svc, w, ns, brief_key="hs", events=events)
    assert r.events_withheld == 3 and r.windows_revised == r.windows == 2
    sent = json.dumps([[m.content for m in c.messages] for c in llm.calls])
    for secret in (secret_key, "4821", "536-90-4399", "s3cr3tP4ss"):
        assert secret not in sent
    assert "rotate the deploy key" in sent
    assert not r.summary_kept  # the only summary read as high
    # The deterministic builder does not copy such text either.
    r = await brief_save(
        services,
        w,
        ns,
        brief_key="hs-det",
        events=[
            ev("user", f"use OPENAI_API_KEY={secret_key} for the tests"),
            ev("user", "wire the tests to the stand-in"),
            ev("error", "password=s3cr3tP4ss rejected"),
            ev("assistant", "my PIN is 4821"),
        ],
    )
    got = await brief_get(services, w, ns, brief_key="hs-det", full=True)
    assert r.events_withheld == 3 and got.sections.goal == "wire the tests to the stand-in"
    for secret in (secret_key, "4821", "s3cr3tP4ss"):
        assert secret not in got.text


async def test_get_by_session_and_project_list_and_delete(services, ns, who):
    w, other = who(ns, user="u1"), who(ns, user="u2")
    await brief_save(
        services,
        w,
        ns,
        project="p1",
        branch="main",
        session_id="s-a",
        user_id="u1",
        sections={"goal": "first"},
    )
    await asyncio.sleep(0.01)
    await brief_save(
        services,
        other,
        ns,
        project="p1",
        branch="dev",
        session_id="s-b",
        user_id="u2",
        sections={"goal": "second"},
    )
    assert (await brief_get(services, w, ns, from_session="s-a")).brief_key == "auto/p1/main"
    assert (await brief_get(services, w, ns, project="p1")).brief_key == "auto/p1/dev"
    with pytest.raises(NotFound):
        await brief_get(services, w, ns, from_session="s-none")
    with pytest.raises(InvalidRequest):
        await brief_get(services, w, ns)

    listed = await brief_list(services, w, ns)
    assert [i.brief_key for i in listed] == ["auto/p1/dev", "auto/p1/main"]
    assert listed[0].line.startswith("auto/p1/dev · r1 · ") and listed[0].line.endswith(" · model · second")
    mine = await brief_list(services, w, ns, mine_only=True, user_id="u1")
    assert [i.brief_key for i in mine] == ["auto/p1/main"]
    by_token = await brief_list(services, other, ns, mine_only=True)
    assert [i.brief_key for i in by_token] == ["auto/p1/dev"]

    # A writer deletes only a brief its own token wrote; an admin any.
    with pytest.raises(Forbidden) as refused:
        await brief_delete(services, w, ns, brief_key="auto/p1/dev")
    assert refused.value.rule == "written_by"
    assert await brief_delete(services, other, ns, brief_key="auto/p1/dev") is True
    assert await brief_delete(services, other, ns, brief_key="auto/p1/dev") is False
    with pytest.raises(NotFound):
        await brief_get(services, w, ns, brief_key="auto/p1/dev")
    assert (await brief_get(services, w, ns, project="p1")).brief_key == "auto/p1/main"
    again = await brief_save(services, w, ns, project="p1", branch="dev", sections={"goal": "fresh"})
    assert again.revision == 2  # numbering continues; the forgotten revision is gone
    with pytest.raises(NotFound):
        await brief_get(services, w, ns, brief_key="auto/p1/dev", revision=1)
    # Once another token revised auto/p1/main, its first writer may no longer delete
    # it alone; an admin may.
    await brief_save(services, other, ns, brief_key="auto/p1/main", sections={"goal": "shared"})
    with pytest.raises(Forbidden):
        await brief_delete(services, w, ns, brief_key="auto/p1/main")
    assert await brief_delete(services, who(ns, role="admin"), ns, brief_key="auto/p1/main") is True


async def test_unchanged_save_writes_nothing(services, ns, who):
    w = who(ns)
    await brief_save(services, w, ns, brief_key="u", sections={"goal": "same"})
    r = await brief_save(services, w, ns, brief_key="u", sections={"goal": "same"})
    assert (r.changed, r.reason, r.revision) == (False, "unchanged", 1)


async def test_an_unread_switch_holds_windows(make_svc, ns, who, monkeypatch):
    real_get = ns_store.get
    reads = {"n": 0}

    def flaky_get(ch, namespace):
        reads["n"] += 1
        if reads["n"] == 2:  # the read before window 2
            raise ConnectionError("clickhouse went away")
        return real_get(ch, namespace)

    monkeypatch.setattr(ns_store, "get", flaky_get)
    llm = ScriptedLLM(lambda msgs: answer(new_done=[f"w{len(llm.calls)}"]))
    svc = make_svc(llm=llm, session_brief_window_chars=2_000)
    r = await brief_save(svc, who(ns), ns, brief_key="u", events=notes(50))
    assert (r.windows, r.windows_revised, r.windows_failed, len(llm.calls)) == (3, 2, 1, 2)

    def down(ch, namespace):
        raise ConnectionError("clickhouse went away")

    monkeypatch.setattr(ns_store, "get", down)
    with pytest.raises(Unavailable):
        await brief_save(svc, who(ns), ns, brief_key="u2", events=notes(5))
    r = await brief_save(svc, who(ns), ns, brief_key="u2", events=notes(5), sections={"goal": "kept"})
    assert (r.changed, r.author, r.summary_kept) == (True, "model", False) and len(llm.calls) == 2
