/**
 * Every op as a typed method, grouped as the API groups them: `client.conversation`,
 * `.saved`, `.memory`, `.briefs`, `.erasure`, `.namespaces`, `.ops`, `.settings`,
 * `.webhooks`. A method takes the op's JSON body (the API's own field names, checked by
 * the compiler against the generated types; `namespace` and `agent` default to the
 * client's) and answers the op's typed JSON.
 */

import type { CallOptions } from "./transport.js";
import type { Body, OpName, ResponseOf, Schemas } from "./types.js";

export type CallWith = CallOptions & { idempotent?: boolean };

/** What the groups call through (the client). */
export interface OpCaller {
  call<Op extends OpName>(op: Op, body: Body<Op>, options?: CallWith): Promise<ResponseOf<Op>>;
  lines<Op extends OpName>(op: Op, body: Body<Op>, options?: CallOptions): AsyncGenerator<Record<string, unknown>>;
}

abstract class Group {
  constructor(protected readonly client: OpCaller) {}
}

type S = Schemas;

export class Conversation extends Group {
  /** One turn (idempotent by msg_id: retried on 503). */
  append(body: Body<"conversation.append">, options?: CallOptions): Promise<S["AppendResponse"]> {
    return this.client.call("conversation.append", body, options) as Promise<S["AppendResponse"]>;
  }

  /** `turns: [...]`, 1 to 500, one result each in order. */
  appendBatch(
    body: Body<"conversation.append"> & { turns: S["TurnIn"][] },
    options?: CallOptions,
  ): Promise<S["AppendBatchResponse"]> {
    return this.client.call("conversation.append", body, options) as Promise<S["AppendBatchResponse"]>;
  }

  search(body: Body<"conversation.search">, options?: CallOptions): Promise<ResponseOf<"conversation.search">> {
    return this.client.call("conversation.search", body, options);
  }

  create(body: Body<"conversation.create">, options?: CallOptions): Promise<ResponseOf<"conversation.create">> {
    return this.client.call("conversation.create", body, options);
  }

  update(body: Body<"conversation.update">, options?: CallOptions): Promise<ResponseOf<"conversation.update">> {
    return this.client.call("conversation.update", body, options);
  }

  threads(body: Body<"conversation.threads">, options?: CallOptions): Promise<ResponseOf<"conversation.threads">> {
    return this.client.call("conversation.threads", body, options);
  }

  get(body: Body<"conversation.get">, options?: CallOptions): Promise<ResponseOf<"conversation.get">> {
    return this.client.call("conversation.get", body, options);
  }

  list(body: Body<"conversation.list">, options?: CallOptions): Promise<ResponseOf<"conversation.list">> {
    return this.client.call("conversation.list", body, options);
  }

  highTurns(
    body: Body<"conversation.high_turns">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.high_turns">> {
    return this.client.call("conversation.high_turns", body, options);
  }

  reembed(body: Body<"conversation.reembed">, options?: CallOptions): Promise<ResponseOf<"conversation.reembed">> {
    return this.client.call("conversation.reembed", body, options);
  }

  /** Not retried: a second compaction would summarise again. */
  compact(body: Body<"conversation.compact">, options?: CallOptions): Promise<ResponseOf<"conversation.compact">> {
    return this.client.call("conversation.compact", body, { ...options, idempotent: false });
  }

  compactStatus(
    body: Body<"conversation.compact_status">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.compact_status">> {
    return this.client.call("conversation.compact_status", body, options);
  }

  /** Tombstone one agent's thread (admin; `confirm_thread_id` must equal `thread_id`). */
  delete(body: Body<"conversation.delete">, options?: CallOptions): Promise<ResponseOf<"conversation.delete">> {
    return this.client.call("conversation.delete", body, options);
  }

  /** Remove one turn and every copy of it, with a receipt (idempotent). */
  deleteMessage(
    body: Body<"conversation.delete_message">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.delete_message">> {
    return this.client.call("conversation.delete_message", body, options);
  }

  /** Replace spans of one turn (`spans`, `ranges` or `high: true`) with a placeholder (admin). */
  redact(body: Body<"conversation.redact">, options?: CallOptions): Promise<ResponseOf<"conversation.redact">> {
    return this.client.call("conversation.redact", body, options);
  }

  setLogging(
    body: Body<"conversation.set_logging">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.set_logging">> {
    return this.client.call("conversation.set_logging", body, options);
  }
}

/** What every replica of a deploy must declare before a save is taken. */
export const SAVED_STATE = "saved_state_preserved_in_compaction";

export class Saved extends Group {
  /** Whether saving is open now: false while a replica of a rolling deploy could lose
   * saved state (a save then answers 503 replica_lacks_capability). A client hides its
   * "save" action while this is false. */
  async available(options?: CallOptions): Promise<boolean> {
    const shared = await this.client.call("replicas.show", {}, options);
    return shared.capabilities.includes(SAVED_STATE);
  }

  save(body: Body<"conversation.save_message">, options?: CallOptions): Promise<ResponseOf<"conversation.save_message">> {
    return this.client.call("conversation.save_message", body, options);
  }

  unsave(
    body: Body<"conversation.unsave_message">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.unsave_message">> {
    return this.client.call("conversation.unsave_message", body, options);
  }

  list(
    body: Body<"conversation.list_saved_messages">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.list_saved_messages">> {
    return this.client.call("conversation.list_saved_messages", body, options);
  }

  status(
    body: Body<"conversation.saved_status">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.saved_status">> {
    return this.client.call("conversation.saved_status", body, options);
  }

  search(
    body: Body<"conversation.search_saved_messages">,
    options?: CallOptions,
  ): Promise<ResponseOf<"conversation.search_saved_messages">> {
    return this.client.call("conversation.search_saved_messages", body, options);
  }
}

export class Memory extends Group {
  /** Not retried: a fact without a key would be added twice. */
  set(body: Body<"memory.set">, options?: CallOptions): Promise<ResponseOf<"memory.set">> {
    return this.client.call("memory.set", body, { ...options, idempotent: false });
  }

  search(body: Body<"memory.search">, options?: CallOptions): Promise<ResponseOf<"memory.search">> {
    return this.client.call("memory.search", body, options);
  }

  list(body: Body<"memory.list">, options?: CallOptions): Promise<ResponseOf<"memory.list">> {
    return this.client.call("memory.list", body, options);
  }

  delete(body: Body<"memory.delete">, options?: CallOptions): Promise<ResponseOf<"memory.delete">> {
    return this.client.call("memory.delete", body, options);
  }

  /** One fact's chain of versions, oldest to newest. */
  history(body: Body<"memory.history">, options?: CallOptions): Promise<ResponseOf<"memory.history">> {
    return this.client.call("memory.history", body, options);
  }

  /** The user's sectioned profile (rebuilt first when stale). */
  profile(body: Body<"memory.profile">, options?: CallOptions): Promise<ResponseOf<"memory.profile">> {
    return this.client.call("memory.profile", body, options);
  }

  /** Extraction from turns (`defer: true`: on the worker pool). Not retried. */
  setFromMessages(
    body: Body<"memory.set_from_messages">,
    options?: CallOptions,
  ): Promise<ResponseOf<"memory.set_from_messages">> {
    return this.client.call("memory.set_from_messages", body, { ...options, idempotent: false });
  }

  recall(body: Body<"memory.recall">, options?: CallOptions): Promise<ResponseOf<"memory.recall">> {
    return this.client.call("memory.recall", body, options);
  }

  /** observe.record: retried only when `obs_id` makes it idempotent. */
  observe(body: Body<"observe.record">, options?: CallOptions): Promise<ResponseOf<"observe.record">> {
    return this.client.call("observe.record", body, { ...options, idempotent: "obs_id" in body });
  }

  crystallize(body: Body<"observe.crystallize">, options?: CallOptions): Promise<ResponseOf<"observe.crystallize">> {
    return this.client.call("observe.crystallize", body, { ...options, idempotent: false });
  }

  /** context.pack: what an agent needs to resume a scope, within a token budget. */
  contextPack(body: Body<"context.pack">, options?: CallOptions): Promise<ResponseOf<"context.pack">> {
    return this.client.call("context.pack", body, options);
  }

  /** The unified `search`: memory, briefs' names and conversations in one answer. */
  searchAll(body: Body<"search">, options?: CallOptions): Promise<ResponseOf<"search">> {
    return this.client.call("search", body, options);
  }

  /** A `question` about the user, answered with citations (or, with no model, the
   * ranked context and a `reason`). */
  ask(body: Body<"memory.ask">, options?: CallOptions): Promise<ResponseOf<"memory.ask">> {
    return this.client.call("memory.ask", body, options);
  }

  /** The state of a deferred set_from_messages (`job_id`). */
  jobStatus(body: Body<"memory.job_status">, options?: CallOptions): Promise<ResponseOf<"memory.job_status">> {
    return this.client.call("memory.job_status", body, options);
  }
}

export class Briefs extends Group {
  /** session.brief_save; a retry of the same (session_id, event_cursor), or of an
   * `if_revision` save, writes nothing twice, so only such a save is retried on 503. */
  save(body: Body<"session.brief_save">, options?: CallOptions): Promise<ResponseOf<"session.brief_save">> {
    const idempotent = Boolean(body.event_cursor) || "if_revision" in body;
    return this.client.call("session.brief_save", body, { ...options, idempotent });
  }

  get(body: Body<"session.brief_get">, options?: CallOptions): Promise<ResponseOf<"session.brief_get">> {
    return this.client.call("session.brief_get", body, options);
  }

  list(body: Body<"session.brief_list">, options?: CallOptions): Promise<ResponseOf<"session.brief_list">> {
    return this.client.call("session.brief_list", body, options);
  }

  delete(body: Body<"session.brief_delete">, options?: CallOptions): Promise<ResponseOf<"session.brief_delete">> {
    return this.client.call("session.brief_delete", body, options);
  }
}

export class Namespaces extends Group {
  getConfig(body: Body<"namespace.get_config">, options?: CallOptions): Promise<ResponseOf<"namespace.get_config">> {
    return this.client.call("namespace.get_config", body, options);
  }

  setPolicy(body: Body<"namespace.set_policy">, options?: CallOptions): Promise<ResponseOf<"namespace.set_policy">> {
    return this.client.call("namespace.set_policy", body, options);
  }
}

export class Erasure extends Group {
  request(body: Body<"erasure.request">, options?: CallOptions): Promise<ResponseOf<"erasure.request">> {
    return this.client.call("erasure.request", body, options);
  }

  status(body: Body<"erasure.status">, options?: CallOptions): Promise<ResponseOf<"erasure.status">> {
    return this.client.call("erasure.status", body, options);
  }

  retention(options?: CallOptions): Promise<ResponseOf<"retention.show">> {
    return this.client.call("retention.show", {}, options);
  }

  /** The user's rows as they stream (one object per NDJSON line: a header, the rows,
   * an `end` line), never held whole in memory: `for await (const row of ...)`. */
  export(body: Body<"erasure.export">, options?: CallOptions): AsyncGenerator<Record<string, unknown>> {
    return this.client.lines("erasure.export", body, options);
  }
}

export class Ops extends Group {
  /** health.show (admin): the backends, the job queue, the embedding outcomes, the rates. */
  health(options?: CallOptions): Promise<ResponseOf<"health.show">> {
    return this.client.call("health.show", {}, options);
  }

  /** What every live replica shares (and, for an admin, the replicas). */
  replicas(options?: CallOptions): Promise<ResponseOf<"replicas.show">> {
    return this.client.call("replicas.show", {}, options);
  }
}

/** The live settings (admin, a token not bound to one user). */
export class Settings extends Group {
  get(options?: CallOptions): Promise<ResponseOf<"settings.get">> {
    return this.client.call("settings.get", {}, options);
  }

  /** `values: { LOOM_...: value or null }`; null clears the override. */
  set(body: Body<"settings.set">, options?: CallOptions): Promise<ResponseOf<"settings.set">> {
    return this.client.call("settings.set", body, options);
  }
}

/** The namespace's signed webhooks (admin, a token not bound to one user). */
export class Webhooks extends Group {
  /** `url`, optional `events`; the namespace's first registration answers its secret. Not retried. */
  register(body: Body<"webhook.register">, options?: CallOptions): Promise<ResponseOf<"webhook.register">> {
    return this.client.call("webhook.register", body, { ...options, idempotent: false });
  }

  list(options?: CallOptions): Promise<ResponseOf<"webhook.list">> {
    return this.client.call("webhook.list", {}, options);
  }

  delete(body: Body<"webhook.delete">, options?: CallOptions): Promise<ResponseOf<"webhook.delete">> {
    return this.client.call("webhook.delete", body, options);
  }

  /** Not retried: a second rotation would replace the first one's secret. */
  rotateSecret(options?: CallOptions): Promise<ResponseOf<"webhook.rotate_secret">> {
    return this.client.call("webhook.rotate_secret", {}, { ...options, idempotent: false });
  }

  /** The delivery log, newest attempt first (`webhook_id`, `event_id`, `limit`). */
  deliveries(body: Body<"webhook.deliveries">, options?: CallOptions): Promise<ResponseOf<"webhook.deliveries">> {
    return this.client.call("webhook.deliveries", body, options);
  }
}
