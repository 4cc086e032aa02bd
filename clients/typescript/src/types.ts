/**
 * The API's types, derived from the generated `./generated/api.ts` (openapi-typescript
 * over Loom's OpenAPI document): every op's name, request body and answer.
 */

import type { components, paths } from "./generated/api.js";

export type { components, paths };

/** Every schema the API documents, by name: `Schemas["ContextPackResponse"]`. */
export type Schemas = components["schemas"];

type OpOf<P> = P extends `/v1/${infer Op}` ? Op : never;

/** Every op's name (`"conversation.append"`, `"context.pack"`, ...): `POST /v1/<op>`. */
export type OpName = OpOf<keyof paths>;

type Post<Op extends OpName> = paths[`/v1/${Op}`]["post"];

/** The JSON body an op reads. */
export type RequestOf<Op extends OpName> =
  Post<Op> extends { requestBody: { content: { "application/json": infer B } } } ? B : never;

/** The JSON an op answers with status 200 (`never` for the streaming `erasure.export`). */
export type ResponseOf<Op extends OpName> =
  Post<Op> extends { responses: { 200: { content: { "application/json": infer R } } } } ? R : never;

/** The body of a refusal: the stable `error` code, a message safe to show, and for bad
 * input the offending `field` and the `rule` it breaks. */
export type ErrorBody = Schemas["ErrorBody"];

type Scoped = "namespace" | "agent";

/** An op's body as a client method takes it: `namespace` and `agent` may be left out
 * (the client's own are sent). */
export type Body<Op extends OpName> = Omit<RequestOf<Op>, Scoped> &
  Partial<Pick<RequestOf<Op>, Extract<keyof RequestOf<Op>, Scoped>>>;

type Has<T, K extends string> = string extends keyof T ? false : K extends keyof T ? true : false;

/** Which of `namespace` and `agent` an op's body has. */
export type Fills<Op extends OpName> = {
  namespace: Has<RequestOf<Op>, "namespace">;
  agent: Has<RequestOf<Op>, "agent">;
};

/**
 * The client's namespace and agent name go into the bodies that have those fields (the
 * API refuses a field a body does not have). The compiler checks every entry against the
 * generated types, and that every op is listed: an op added to, or changed in, the API
 * fails the build until this table says what it takes.
 */
export const FILLS: { readonly [Op in OpName]: Fills<Op> } = {
  "context.pack": { namespace: true, agent: true },
  "conversation.append": { namespace: true, agent: true },
  "conversation.compact": { namespace: true, agent: true },
  "conversation.compact_status": { namespace: true, agent: false },
  "conversation.create": { namespace: true, agent: true },
  "conversation.delete": { namespace: true, agent: true },
  "conversation.delete_message": { namespace: true, agent: true },
  "conversation.get": { namespace: true, agent: true },
  "conversation.high_turns": { namespace: true, agent: false },
  "conversation.list": { namespace: true, agent: true },
  "conversation.list_saved_messages": { namespace: true, agent: false },
  "conversation.redact": { namespace: true, agent: true },
  "conversation.reembed": { namespace: true, agent: false },
  "conversation.save_message": { namespace: true, agent: true },
  "conversation.saved_status": { namespace: true, agent: false },
  "conversation.search": { namespace: true, agent: true },
  "conversation.search_saved_messages": { namespace: true, agent: false },
  "conversation.set_logging": { namespace: true, agent: false },
  "conversation.threads": { namespace: true, agent: true },
  "conversation.unsave_message": { namespace: true, agent: true },
  "conversation.update": { namespace: true, agent: true },
  "erasure.export": { namespace: false, agent: false },
  "erasure.request": { namespace: false, agent: false },
  "erasure.status": { namespace: false, agent: false },
  "health.show": { namespace: false, agent: false },
  "memory.ask": { namespace: true, agent: false },
  "memory.delete": { namespace: true, agent: false },
  "memory.history": { namespace: true, agent: false },
  "memory.job_status": { namespace: true, agent: false },
  "memory.list": { namespace: true, agent: false },
  "memory.profile": { namespace: true, agent: false },
  "memory.recall": { namespace: true, agent: false },
  "memory.search": { namespace: true, agent: false },
  "memory.set": { namespace: true, agent: false },
  "memory.set_from_messages": { namespace: true, agent: false },
  "namespace.get_config": { namespace: true, agent: false },
  "namespace.set_policy": { namespace: true, agent: false },
  "observe.crystallize": { namespace: true, agent: false },
  "observe.record": { namespace: true, agent: false },
  "replicas.show": { namespace: false, agent: false },
  "retention.show": { namespace: false, agent: false },
  search: { namespace: true, agent: false },
  "session.brief_delete": { namespace: true, agent: false },
  "session.brief_get": { namespace: true, agent: false },
  "session.brief_list": { namespace: true, agent: false },
  "session.brief_save": { namespace: true, agent: true },
  "settings.get": { namespace: false, agent: false },
  "settings.set": { namespace: false, agent: false },
  "webhook.delete": { namespace: true, agent: false },
  "webhook.deliveries": { namespace: true, agent: false },
  "webhook.list": { namespace: true, agent: false },
  "webhook.register": { namespace: true, agent: false },
  "webhook.rotate_secret": { namespace: true, agent: false },
};

/** Every op the API serves, in the table's order. */
export const OPS = Object.keys(FILLS) as OpName[];
