/**
 * The client against a live `loom serve` (the Python suite starts one and runs these:
 * tests/sdk/test_typescript_sdk.py). It names the server and the tokens in the
 * environment: LOOM_URL, LOOM_TOKEN (admin of LOOM_TEST_NAMESPACE and
 * LOOM_TEST_QUIET_NAMESPACE), LOOM_TEST_VIEWER_TOKEN (viewer of the first). Without them
 * every test fails: a missing server is a failure, not a skip.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { MockLanguageModelV3 } from "ai/test";

import { Agent, LoomError } from "@loom-memory/client";
import { LoomChatMemory, promptFromPack } from "@loom-memory/client/ai-sdk";

import { reply } from "../examples/vercel-ai.js";

function need(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these through tests/sdk/test_typescript_sdk.py`);
  return value;
}

const env = () => ({
  ns: need("LOOM_TEST_NAMESPACE"),
  quiet: need("LOOM_TEST_QUIET_NAMESPACE"),
  viewer: need("LOOM_TEST_VIEWER_TOKEN"),
  url: need("LOOM_URL"),
  token: need("LOOM_TOKEN"),
});

test("a session writes the transcript, hands turns to extraction and resumes", async () => {
  const { ns } = env();
  const bot = new Agent(ns, "staging", "support-bot"); // LOOM_URL and LOOM_TOKEN from the environment
  await bot.conversation.setLogging({ enabled: true });
  const s = bot.session("t-1", { userId: "u1", flushEvery: 3 });
  await s.append({ role: "user", content: "We moved invoices to the new ledger." });
  await s.append({ role: "assistant", content: "Noted; I'll update the export job.", msg_id: "a-1" });
  assert.equal(s.transcriptStored, true);
  const turns = (await bot.conversation.list({ thread_id: "t-1" })).messages;
  assert.deepEqual(
    turns.map((t) => [t.role, t.user_id, t.metadata, t.msg_id === "a-1"]),
    [
      ["user", "u1", { environment: "staging" }, false],
      ["assistant", "u1", { environment: "staging" }, true],
    ],
  );
  const recall = { user_id: "u1", query: "invoices ledger export" };
  assert.deepEqual((await bot.memory.recall(recall)).hits, [], "two turns buffered, flushEvery is 3");

  await s.append({ role: "user", content: "Refunds stay on the old ledger until March." });
  const held = new Set((await bot.memory.recall(recall)).hits.map((h) => h.content));
  assert.ok(held.has("We moved invoices to the new ledger.") && held.size === 3);

  await s.append({ role: "user", content: "The credit notes move in April." });
  assert.notEqual(await s.close(), null, "the fourth turn goes to extraction at close");
  const april = await bot.memory.recall({ user_id: "u1", query: "credit notes April" });
  assert.deepEqual(
    april.hits.map((h) => h.content),
    ["The credit notes move in April."],
  );
  await assert.rejects(s.append({ role: "user", content: "too late" }), /closed/);

  const resumed = await bot.session("t-1", { userId: "u1" }).resume({ query: "where do invoices go?" });
  const tail = resumed.sections.find((sec) => sec.name === "transcript");
  assert.ok(tail?.items.some((i) => i.text === "user: The credit notes move in April."));
});

test("transcriptStored is false where the namespace does not record", async () => {
  const { quiet } = env();
  const bot = new Agent(quiet, "local", "support-bot");
  const s = bot.session("t-2", { userId: "u2" });
  const answer = await s.append({ role: "user", content: "hello" });
  assert.equal(s.transcriptStored, false);
  assert.equal(answer.results[0]?.reason, "logging_disabled");
  assert.deepEqual((await bot.conversation.list({ thread_id: "t-2" })).messages, []);
  await s.close();
});

test("refusals carry the API's stable codes, fields and rules", async () => {
  const { ns, viewer } = env();
  const bot = new Agent(ns, "local", "support-bot");
  const found = await bot.conversation.search({ query: "anything" });
  assert.deepEqual(found.namespaces, [ns]);

  const bad = await bot.conversation.search({ query: "anything", limit: 0 }).catch((e: unknown) => e);
  assert.ok(bad instanceof LoomError);
  assert.deepEqual([bad.status, bad.error, bad.field], [422, "invalid_request", "limit"]);
  assert.ok(bad.rule, "the rule the field breaks is named");

  const missing = await bot.briefs.get({ brief_key: "no-such-brief" }).catch((e: unknown) => e);
  assert.ok(missing instanceof LoomError);
  assert.deepEqual([missing.status, missing.error], [404, "not_found"]);

  const reader = new Agent(ns, "local", "reader", { token: viewer });
  const denied = await reader.conversation.append({ thread_id: "t", role: "user", content: "hi" }).catch((e) => e);
  assert.ok(denied instanceof LoomError);
  assert.deepEqual([denied.status, denied.error], [403, "forbidden"]);

  const nobody = new Agent(ns, "local", "x", { token: "not-a-token" });
  const unknown = await nobody.briefs.list({}).catch((e: unknown) => e);
  assert.ok(unknown instanceof LoomError);
  assert.deepEqual([unknown.status, unknown.error], [401, "unauthorized"]);
});

test("briefs save and read back; a user's rows stream from erasure.export", async () => {
  const { ns } = env();
  const bot = new Agent(ns, "local", "support-bot");
  const saved = await bot.briefs.save({
    project: "billing",
    branch: "ledger-move",
    sections: { goal: "Move invoices to the new ledger", next_steps: ["Update the export job"] },
  });
  const brief = await bot.briefs.get({ brief_key: saved.brief_key });
  assert.deepEqual([brief.project, brief.branch, brief.agent], ["billing", "ledger-move", "support-bot"]);
  assert.equal(brief.sections.goal, "Move invoices to the new ledger");

  await bot.conversation.setLogging({ enabled: true });
  await bot.session("t-x", { userId: "u-x" }).append({ role: "user", content: "Export me." });
  const kinds: unknown[] = [];
  for await (const row of bot.erasure.export({ user_id: "u-x", namespaces: [ns] })) kinds.push(row.kind);
  assert.ok(kinds.includes("turn"), `rows of kinds ${JSON.stringify(kinds)}`);
});

test("the Vercel AI SDK adapter prompts with Loom's memory and records the exchange", async () => {
  const { ns } = env();
  const bot = new Agent(ns, "local", "chat-bot");
  await bot.conversation.setLogging({ enabled: true });
  await bot.memory.set({ user_id: "u-9", facts: [{ text: "Wants invoices issued in EUR", key: "currency" }] });
  const memory = new LoomChatMemory(bot.session("chat-1", { userId: "u-9" }), { instructions: "Be brief." });

  const model = new MockLanguageModelV3({
    doGenerate: async () => ({
      content: [{ type: "text", text: "They go to the new ledger, in EUR." }],
      finishReason: { unified: "stop", raw: "stop" },
      usage: {
        inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
        outputTokens: { total: 8, text: 8, reasoning: 0 },
      },
      warnings: [],
    }),
  });
  assert.equal(await reply(memory, model, "Which currency for invoices?"), "They go to the new ledger, in EUR.");
  assert.equal(await reply(memory, model, "And where do they go?"), "They go to the new ledger, in EUR.");

  const [first, second] = model.doGenerateCalls.map((call) => call.prompt);
  const system = first!.find((m) => m.role === "system");
  assert.equal(system?.content, "Be brief.\n\nWhat you know about the user:\n- Wants invoices issued in EUR");
  const said = second!
    .filter((m) => m.role !== "system")
    .map((m) => [m.role, (m.content as { type: string; text?: string }[]).map((p) => p.text).join("")]);
  assert.deepEqual(said, [
    ["user", "Which currency for invoices?"],
    ["assistant", "They go to the new ledger, in EUR."],
    ["user", "And where do they go?"],
  ]);

  const stored = (await bot.conversation.list({ thread_id: "chat-1" })).messages;
  assert.deepEqual(
    stored.map((t) => [t.role, t.user_id]),
    [
      ["user", "u-9"],
      ["assistant", "u-9"],
      ["user", "u-9"],
      ["assistant", "u-9"],
    ],
    "the same answer twice is two turns",
  );
  const again = await memory.record("And where do they go?", { text: "x", response: { id: "r-1" } });
  const repeat = await memory.record("And where do they go?", { text: "x", response: { id: "r-1" } });
  assert.deepEqual(
    [again.stored, repeat.results.map((r) => r.reason)],
    [2, ["duplicate", "duplicate"]],
    "the same result recorded again adds nothing",
  );
  assert.deepEqual(promptFromPack({ sections: [], token_budget: 64, tokens_used: 0 }), { messages: [] });
});
