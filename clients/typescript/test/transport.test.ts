/**
 * The transport's rules against a scripted HTTP server in this process (a live Loom
 * cannot be made to answer 503 on cue): retries with backoff honouring `Retry-After`,
 * only for idempotent calls; typed errors; the timeout; the abort signal; every op has a
 * method.
 */

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { LoomClient, LoomError, OPS } from "@loom-memory/client";

type Reply = (req: IncomingMessage, res: ServerResponse, body: unknown) => void;

let server: Server;
let baseUrl = "";
let script: Reply[] = [];
const seen: { op: string; body: unknown; at: number; auth: string | undefined }[] = [];

before(async () => {
  server = createServer((req, res) => {
    let raw = "";
    req.on("data", (chunk: Buffer) => (raw += chunk.toString()));
    req.on("end", () => {
      const body: unknown = raw ? JSON.parse(raw) : null;
      seen.push({ op: req.url?.replace("/v1/", "") ?? "", body, at: Date.now(), auth: req.headers.authorization });
      const reply = script.shift() ?? ok({});
      reply(req, res, body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => {
  server.closeAllConnections?.();
  server.close();
});

function ok(answer: unknown): Reply {
  return (_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(answer));
  };
}

function refuse(status: number, body: unknown, headers: Record<string, string> = {}): Reply {
  return (_req, res) => {
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify(body));
  };
}

const hang: Reply = () => undefined; // never answers (the server closes it at the end)

function client(options: ConstructorParameters<typeof LoomClient>[0] = {}): LoomClient {
  script = [];
  seen.length = 0;
  return new LoomClient({
    baseUrl,
    token: "tok",
    namespace: "acme",
    agent: "bot",
    retry: { firstBackoffMs: 5 },
    ...options,
  });
}

const BUSY = { error: "backend_unavailable", message: "a backend is unavailable; retry" };

test("a 503 is retried after its Retry-After, then answered", async () => {
  const c = client();
  script = [refuse(503, BUSY, { "retry-after": "0.3" }), refuse(503, BUSY, { "retry-after": "0.3" }), ok({ hits: [] })];
  const found = await c.memory.search({ user_id: "u-7", query: "currency" });
  assert.deepEqual(found, { hits: [] });
  assert.equal(seen.length, 3);
  assert.ok(seen[1]!.at - seen[0]!.at >= 290, `waited ${seen[1]!.at - seen[0]!.at} ms, Retry-After said 300`);
  assert.ok(seen[2]!.at - seen[1]!.at >= 290);
  // the client's namespace filled in (memory.search has no agent field: none sent)
  assert.deepEqual(seen[0]!.body, { user_id: "u-7", query: "currency", namespace: "acme" });
  assert.equal(seen[0]!.auth, "Bearer tok");
});

test("the wait is capped by maxBackoffMs, and the retries end with the last refusal", async () => {
  const c = client({ retry: { attempts: 2, firstBackoffMs: 5, maxBackoffMs: 50 } });
  script = [refuse(503, BUSY, { "retry-after": "30" }), refuse(503, { ...BUSY, error: "unavailable" })];
  const started = Date.now();
  const err = await c.briefs.get({ brief_key: "k" }).catch((e: unknown) => e);
  assert.ok(err instanceof LoomError);
  assert.deepEqual([err.status, err.error], [503, "unavailable"]);
  assert.equal(seen.length, 2);
  assert.ok(Date.now() - started < 10_000, "a 30 s Retry-After was capped at 50 ms");
});

test("a write that is not idempotent is not retried", async () => {
  const c = client();
  script = [refuse(503, BUSY, { "retry-after": "0" })];
  const err = await c.memory.set({ user_id: "u-7", facts: [{ text: "EUR" }] }).catch((e: unknown) => e);
  assert.ok(err instanceof LoomError && err.error === "backend_unavailable");
  assert.equal(seen.length, 1);
});

test("a refusal is a LoomError carrying the API's code, message, field and rule", async () => {
  const c = client();
  const body = {
    error: "invalid_request",
    message: "limit: greater than or equal to 1",
    field: "limit",
    rule: "greater than or equal to 1",
    errors: [{ field: "limit", rule: "greater than or equal to 1", type: "greater_than_equal" }],
  };
  script = [refuse(422, body)];
  const err = await c.conversation.search({ query: "q", limit: 0 }).catch((e: unknown) => e);
  assert.ok(err instanceof LoomError);
  assert.deepEqual(
    [err.status, err.error, err.message, err.field, err.rule, err.errors.length],
    [422, "invalid_request", "limit: greater than or equal to 1", "limit", "greater than or equal to 1", 1],
  );
  assert.equal(seen.length, 1, "a 4xx is not retried");
  assert.deepEqual(seen[0]!.body, { query: "q", limit: 0, namespace: "acme", agent: "bot" });
});

test("no answer within timeoutMs is a timeout, not repeated", async () => {
  const c = client({ timeoutMs: 150 });
  script = [hang, ok({ messages: [] })];
  const err = await c.conversation.list({ thread_id: "t" }).catch((e: unknown) => e);
  assert.ok(err instanceof LoomError);
  assert.deepEqual([err.status, err.error], [0, "timeout"]);
  assert.ok(seen.length <= 1, "not sent again"); // (a loaded machine may time out before the server reads it)
});

test("an abort signal ends a call in flight, and a wait between retries, with its reason", async () => {
  const c = client({ timeoutMs: 0, retry: { firstBackoffMs: 5, maxBackoffMs: 60_000 } });
  const inFlight = new AbortController();
  script = [() => inFlight.abort(new Error("user left"))]; // once the server has the call, never answered
  await assert.rejects(c.conversation.get({ thread_id: "t" }, { signal: inFlight.signal }), /user left/);

  seen.length = 0;
  const waiting = new AbortController();
  const busy = refuse(503, BUSY, { "retry-after": "30" });
  script = [
    (req, res, body) => {
      busy(req, res, body);
      setTimeout(() => waiting.abort(), 100); // the client is waiting out the Retry-After
    },
  ];
  const started = Date.now();
  const err = await c.conversation.get({ thread_id: "t" }, { signal: waiting.signal }).catch((e: unknown) => e);
  assert.equal((err as Error).name, "AbortError");
  assert.ok(Date.now() - started < 10_000, "the 30 s wait was cut short");
  assert.equal(seen.length, 1);
});

test("a server that cannot be reached is retried, then `unreachable`", async () => {
  const closed = createServer();
  await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
  const port = (closed.address() as AddressInfo).port;
  await new Promise((resolve) => closed.close(resolve)); // nothing listens there now
  const c = client({ baseUrl: `http://127.0.0.1:${port}`, retry: { attempts: 3, firstBackoffMs: 5 } });
  const err = await c.ops.replicas().catch((e: unknown) => e);
  assert.ok(err instanceof LoomError);
  assert.deepEqual([err.status, err.error], [0, "unreachable"]);
  assert.match(err.message, /ECONNREFUSED/);
});

test("every op the API serves has a method", async () => {
  const c = client();
  const groups = ["conversation", "saved", "memory", "briefs", "erasure", "namespaces", "ops", "settings", "webhooks"];
  for (const name of groups) {
    const group = (c as unknown as Record<string, Record<string, (body: object) => unknown>>)[name]!;
    for (const method of Object.getOwnPropertyNames(Object.getPrototypeOf(group))) {
      if (method === "constructor") continue;
      script = [ok({ capabilities: [] })];
      const answer = group[method]!.call(group, {});
      if (answer && typeof answer === "object" && Symbol.asyncIterator in answer) {
        for await (const _ of answer as AsyncIterable<unknown>); // erasure.export streams
      } else {
        await answer;
      }
    }
  }
  const called = new Set(seen.map((s) => s.op));
  assert.deepEqual(
    OPS.filter((op) => !called.has(op)),
    [],
  );
});
