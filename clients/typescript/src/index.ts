/**
 * Loom's TypeScript client: `Agent` and `Session` (agent.ts), every op typed from the
 * API's OpenAPI document (ops.ts, types.ts, generated/api.ts), the transport over `fetch`
 * with retries, a timeout and an abort signal (transport.ts), typed errors (errors.ts).
 * The Vercel AI SDK adapter is `@loom-memory/client/ai-sdk`.
 */

export { Agent, FLUSH_EVERY, Session } from "./agent.js";
export type { ResumeFields, SessionOptions, TurnInput } from "./agent.js";
export { LoomClient } from "./client.js";
export type { LoomClientOptions } from "./client.js";
export { LoomError } from "./errors.js";
export type { ErrorItem, LoomErrorCode } from "./errors.js";
export { Briefs, Conversation, Erasure, Memory, Namespaces, Ops, SAVED_STATE, Saved, Settings, Webhooks } from "./ops.js";
export type { CallWith } from "./ops.js";
export { DEFAULT_URL, ENV_TOKEN, ENV_URL, Transport, retryAfterMs } from "./transport.js";
export type { CallOptions, ClientOptions, RetryOptions } from "./transport.js";
export { FILLS, OPS } from "./types.js";
export type { Body, ErrorBody, Fills, OpName, RequestOf, ResponseOf, Schemas, components, paths } from "./types.js";
