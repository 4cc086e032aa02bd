#!/usr/bin/env node
// Loom's capture hook for Claude Code (Node >= 18, no dependencies).
//
// One script for four hook events (the event is read from the hook's JSON on stdin):
//   Stop          append each new user/assistant turn of the session transcript to Loom
//                 (msg_id = the transcript entry's uuid, so a retry never doubles a turn);
//   PreCompact    the same, then save the session's brief from the transcript's events
//                 (session.brief_save; the server condenses them: zero model tokens here)
//                 and record its tool actions as observations (observe.record);
//   SessionEnd    the same as PreCompact, then hand the session's turns to
//                 memory.set_from_messages (defer: true), recorded or not, and
//                 crystallize the session's observations (observe.crystallize);
//   SessionStart  print the names of the namespace's saved briefs (never their content:
//                 loading one is the person's choice, through the loom-session skill).
//
// It never blocks the agent: every call has a short timeout, every failure is noted on
// stderr and the hook exits 0; its place in the transcript only moves past what Loom
// answered, so what failed is sent again next time (appends are idempotent by msg_id).
//
// Environment: LOOM_URL (default http://127.0.0.1:7777), LOOM_TOKEN (a writer token;
// without it the hook does nothing), LOOM_NAMESPACE (default "default"), LOOM_AGENT
// (default "claude-code"), LOOM_USER_ID, LOOM_CAPTURE_CONVERSATIONS=false (no transcript
// appends; briefs and memory still work), LOOM_HOOK_STATE_DIR (default
// ~/.loom/claude-code), LOOM_HOOK_TIMEOUT_MS (default 3000).

import { readFileSync, writeFileSync, mkdirSync, existsSync, renameSync, realpathSync } from "node:fs";
import { homedir } from "node:os";
import { basename, join } from "node:path";
import { pathToFileURL } from "node:url";

const env = process.env;
const CONFIG = {
  url: (env.LOOM_URL || "http://127.0.0.1:7777").replace(/\/+$/, ""),
  token: env.LOOM_TOKEN || "",
  namespace: env.LOOM_NAMESPACE || "default",
  agent: env.LOOM_AGENT || "claude-code",
  userId: env.LOOM_USER_ID || "",
  capture: (env.LOOM_CAPTURE_CONVERSATIONS || "true").toLowerCase() !== "false",
  stateDir: env.LOOM_HOOK_STATE_DIR || join(homedir(), ".loom", "claude-code"),
  timeoutMs: Number(env.LOOM_HOOK_TIMEOUT_MS || 3000),
};
const VERDICT_TTL_MS = 5 * 60 * 1000; // how long the namespace's recording verdict is trusted
const BATCH = 200; // turns per append (the API takes up to 500)
const MAX_EVENTS = 4000; // events per brief save (the API's bound)
const MAX_TEXT = 32000; // characters of one event's text (the API's bound)

// ---- Loom's API ---------------------------------------------------------------------

async function call(op, body) {
  const r = await fetch(`${CONFIG.url}/v1/${op}`, {
    method: "POST",
    headers: { authorization: `Bearer ${CONFIG.token}`, "content-type": "application/json" },
    body: JSON.stringify({ namespace: CONFIG.namespace, ...body }),
    signal: AbortSignal.timeout(CONFIG.timeoutMs),
  });
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(`${op}: ${r.status} ${answer.error || ""} ${answer.message || ""}`.trim());
  return answer;
}

// ---- the session's place --------------------------------------------------------------

function statePath(sessionId) {
  return join(CONFIG.stateDir, `${sessionId.replace(/[^A-Za-z0-9._-]/g, "_")}.json`);
}

function loadState(sessionId) {
  const path = statePath(sessionId);
  const empty = { sent: 0, briefCursor: 0, observed: 0, verdict: null, verdictAt: 0 };
  if (!existsSync(path)) return empty;
  try {
    return { ...empty, ...JSON.parse(readFileSync(path, "utf8")) };
  } catch {
    return empty;
  }
}

function saveState(sessionId, state) {
  mkdirSync(CONFIG.stateDir, { recursive: true });
  const path = statePath(sessionId);
  writeFileSync(`${path}.tmp`, JSON.stringify(state));
  renameSync(`${path}.tmp`, path); // whole or not at all
}

// ---- the transcript ---------------------------------------------------------------------

export function readEntries(transcriptPath) {
  if (!transcriptPath || !existsSync(transcriptPath)) return [];
  const entries = [];
  for (const line of readFileSync(transcriptPath, "utf8").split("\n")) {
    if (!line.trim()) continue;
    try {
      entries.push(JSON.parse(line));
    } catch {
      // a line being written right now: read it next time
    }
  }
  return entries;
}

function parts(entry) {
  const content = entry?.message?.content;
  if (typeof content === "string") return [{ type: "text", text: content }];
  return Array.isArray(content) ? content : [];
}

// A user or assistant turn: the entry's text (tool calls and their results are not turns).
export function turnOf(entry) {
  if (!["user", "assistant"].includes(entry.type) || !entry.uuid || entry.isMeta || entry.isSidechain) return null;
  const text = parts(entry)
    .filter((p) => p.type === "text" && typeof p.text === "string")
    .map((p) => p.text)
    .join("\n")
    .trim();
  if (!text) return null;
  return { role: entry.type, content: text, msg_id: entry.uuid, ts: entry.timestamp };
}

const clip = (text) => String(text ?? "").slice(0, MAX_TEXT);

// What happened, as brief events: turns, edits, commands, reads, searches, errors, summaries.
export function eventsOf(entry) {
  if (entry.type === "summary" && entry.summary) return [{ kind: "summary", text: clip(entry.summary) }];
  const turn = turnOf(entry);
  const events = turn ? [{ kind: turn.role, text: clip(turn.content) }] : [];
  for (const p of parts(entry)) {
    if (p.type === "tool_use") events.push(toolEvent(p.name || "", p.input || {}));
    if (p.type === "tool_result" && p.is_error) {
      const text = typeof p.content === "string" ? p.content : JSON.stringify(p.content ?? "");
      events.push({ kind: "error", text: clip(text) });
    }
  }
  return events;
}

function toolEvent(name, input) {
  const path = String(input.file_path || input.notebook_path || input.path || "").slice(0, 1024);
  if (["Edit", "MultiEdit", "Write", "NotebookEdit"].includes(name)) return { kind: "edit", path };
  if (name === "Read") return { kind: "read", path };
  if (name === "Bash") return { kind: "command", text: clip(input.command) };
  if (["Grep", "Glob", "WebSearch"].includes(name)) return { kind: "search", text: clip(input.pattern || input.query) };
  return { kind: "tool", text: clip(name) };
}

// ---- the steps ------------------------------------------------------------------------------

async function recording(state) {
  if (state.verdict !== null && Date.now() - state.verdictAt < VERDICT_TTL_MS) return state.verdict;
  const config = await call("namespace.get_config", {});
  state.verdict = Boolean(config.conversation_logging_enabled);
  state.verdictAt = Date.now();
  return state.verdict;
}

async function appendNew(entries, state) {
  if (!CONFIG.capture) return;
  const turns = entries.slice(state.sent).map(turnOf);
  if (!(await recording(state))) {
    state.sent = entries.length; // recording is off: nothing would be kept
    return;
  }
  for (let i = 0; i < turns.length; i += BATCH) {
    const batch = turns.slice(i, i + BATCH).filter(Boolean);
    if (batch.length) {
      const withUser = batch.map(({ ts, ...t }) => (CONFIG.userId ? { ...t, user_id: CONFIG.userId } : t));
      const answer = await call("conversation.append", {
        agent: CONFIG.agent,
        turns: withUser.map((t) => ({ thread_id: state.threadId, ...t })),
      });
      if (answer.results.some((r) => r.reason === "logging_disabled")) state.verdict = false;
    }
    state.sent += Math.min(BATCH, turns.length - i); // only past what Loom answered
  }
}

async function saveBrief(entries, state, cwd) {
  const events = entries.slice(state.briefCursor).flatMap(eventsOf);
  if (!events.length) return;
  const scope = { agent: CONFIG.agent, session_id: state.threadId, ...projectOf(cwd) };
  if (CONFIG.userId) scope.user_id = CONFIG.userId;
  for (let i = 0; i < events.length; i += MAX_EVENTS) {
    const last = i + MAX_EVENTS >= events.length;
    const cursor = last ? String(entries.length) : `${entries.length}:${i}`;
    await call("session.brief_save", { ...scope, events: events.slice(i, i + MAX_EVENTS), event_cursor: cursor });
  }
  state.briefCursor = entries.length;
}

// Tool actions as episodic observations: each tool call with its result's outcome,
// keyed by the call's id (a retry records nothing twice).
export function observationsOf(entries) {
  const results = new Map();
  for (const entry of entries) {
    for (const p of parts(entry)) {
      if (p.type === "tool_result" && p.tool_use_id) {
        const text = typeof p.content === "string" ? p.content : JSON.stringify(p.content ?? "");
        results.set(p.tool_use_id, `${p.is_error ? "error" : "ok"}: ${text}`.slice(0, 8000));
      }
    }
  }
  const observed = [];
  for (const entry of entries) {
    for (const p of parts(entry)) {
      if (p.type !== "tool_use" || !p.id || !p.name) continue;
      observed.push({
        tool: String(p.name).slice(0, 256),
        input_summary: JSON.stringify(p.input ?? {}).slice(0, 8000),
        outcome: results.get(p.id) ?? "",
        obs_id: String(p.id).slice(0, 256),
        ts: entry.timestamp,
      });
    }
  }
  return observed;
}

async function recordObservations(entries, state) {
  const observed = observationsOf(entries).slice(state.observed);
  const scope = { run_id: state.threadId, session_id: state.threadId };
  if (CONFIG.userId) scope.user_id = CONFIG.userId;
  for (const o of observed) {
    await call("observe.record", { ...scope, ...o });
    state.observed += 1; // only past what Loom answered
  }
}

async function handToMemory(entries, state) {
  const messages = entries.map(turnOf).filter(Boolean);
  for (let i = 0; i < messages.length; i += 500) {
    await call("memory.set_from_messages", {
      ...(CONFIG.userId ? { user_id: CONFIG.userId } : {}),
      session_id: state.threadId,
      messages: messages.slice(i, i + 500),
      defer: true,
    });
  }
}

async function primer() {
  const listed = await call("session.brief_list", { limit: 20 });
  if (!listed.briefs?.length) return;
  const names = listed.briefs.map((b) => `- ${b.brief_key} (revision ${b.revision}, ${b.updated_at})`);
  process.stdout.write(
    `Saved Loom briefs in namespace ${CONFIG.namespace} (load one with the loom-session skill ` +
      `when the person asks to resume that work):\n${names.join("\n")}\n`,
  );
}

// A resumed session's transcript starts with the turns it resumed, under their first
// session's id: the thread is that first session's, so resuming never starts a second
// copy of the same conversation (the resumed turns answer "duplicate").
export function threadOf(entries, sessionId) {
  const first = entries.find((e) => typeof e.sessionId === "string" && e.sessionId);
  return `claude-code/${first ? first.sessionId : sessionId}`;
}

export function projectOf(cwd) {
  const out = { project: basename(cwd || process.cwd()).slice(0, 256) };
  try {
    const head = readFileSync(join(cwd || ".", ".git", "HEAD"), "utf8").trim();
    if (head.startsWith("ref: refs/heads/")) out.branch = head.slice("ref: refs/heads/".length).slice(0, 256);
  } catch {
    // not a git checkout: the project alone names the brief
  }
  return out;
}

async function main() {
  const raw = readFileSync(0, "utf8");
  const hook = raw.trim() ? JSON.parse(raw) : {};
  if (!CONFIG.token) {
    process.stderr.write("loom: LOOM_TOKEN is not set; nothing captured\n");
    return;
  }
  const event = hook.hook_event_name || "Stop";
  if (event === "SessionStart") return primer();
  if (!hook.session_id) return;
  const entries = readEntries(hook.transcript_path);
  const state = { ...loadState(hook.session_id), threadId: threadOf(entries, hook.session_id) };
  try {
    await appendNew(entries, state);
    if (event === "PreCompact" || event === "SessionEnd") {
      await saveBrief(entries, state, hook.cwd);
      await recordObservations(entries, state);
    }
    if (event === "SessionEnd") {
      await handToMemory(entries, state);
      await call("observe.crystallize", { run_id: state.threadId, ...(CONFIG.userId ? { user_id: CONFIG.userId } : {}) });
    }
  } finally {
    saveState(hook.session_id, state);
  }
}

// Run as a program (by any path: relative, or through a link), not imported by a test.
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((err) => {
    process.stderr.write(`loom: ${err.message}; will retry next time\n`);
  });
}
