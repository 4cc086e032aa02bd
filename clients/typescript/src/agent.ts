/**
 * `Agent`: one agent of one namespace, talking to a Loom API; `Session`: that agent in
 * one thread for one user.
 *
 * `new Agent(namespace, environment, name)`:
 * - `namespace`: the namespace every call goes to (unless a call names another);
 * - `environment`: where the agent runs ("local", "staging", "prod"...), recorded on every
 *   turn the agent appends (its metadata's `environment`), so one namespace can tell a
 *   developer's runs from production's;
 * - `name`: the agent's name, the `agent` of its turns, threads and briefs.
 */

import { LoomClient } from "./client.js";
import type { CallOptions, ClientOptions } from "./transport.js";
import type { Body, ResponseOf, Schemas } from "./types.js";

/** Turns buffered before they go to memory.set_from_messages. */
export const FLUSH_EVERY = 10;

export interface SessionOptions {
  /** The user the turns and the memory belong to. */
  userId?: string;
  /** Scopes the session's memory (default: the thread). */
  sessionId?: string;
  /** Turns buffered before they go to extraction (default 10). */
  flushEvery?: number;
}

/** A turn as `Session.append` takes it: the API's turn, its thread the session's. */
export type TurnInput = Omit<Schemas["TurnIn"], "thread_id"> & { thread_id?: string };

/** context.pack's fields, less the scope the session supplies. */
export type ResumeFields = Omit<Body<"context.pack">, "user_id" | "session_id" | "thread_id">;

export class Agent extends LoomClient {
  constructor(
    readonly namespace: string,
    readonly environment: string,
    readonly name: string,
    options: ClientOptions = {},
  ) {
    super({ ...options, namespace, agent: name });
  }

  /** This agent in thread `threadId` for `userId`. */
  session(threadId: string, options: SessionOptions = {}): Session {
    return new Session(this, threadId, options);
  }
}

/**
 * Appends go to the transcript at once and, every `flushEvery` turns, to
 * memory.set_from_messages (deferred: extraction runs on the worker pool), whether or not
 * the namespace records transcripts; `close()` sends what is left.
 */
export class Session {
  readonly userId: string;
  readonly sessionId: string;
  readonly flushEvery: number;
  /** Whether the namespace records transcripts: null until the first append answers. */
  transcriptStored: boolean | null = null;
  #buffer: Schemas["MessageIn"][] = [];
  #closed = false;

  constructor(
    readonly agent: Agent,
    readonly threadId: string,
    options: SessionOptions = {},
  ) {
    this.userId = options.userId ?? "";
    this.sessionId = options.sessionId || threadId;
    this.flushEvery = options.flushEvery ?? FLUSH_EVERY;
    if (!(this.flushEvery >= 1)) throw new RangeError("flushEvery must be at least 1");
  }

  /** context.pack for this scope: the user's relevant facts, this thread's transcript
   * tail (when recorded), evidence hits; a brief only when `brief_key` names one. */
  resume(fields: ResumeFields = {}, options?: CallOptions): Promise<ResponseOf<"context.pack">> {
    return this.agent.memory.contextPack(
      { ...fields, ...this.#user(), session_id: this.sessionId, thread_id: this.threadId },
      options,
    );
  }

  /** Write the turns ({role, content}, and optionally msg_id, metadata, run_id, ...) to
   * the thread; `transcriptStored` then says whether the namespace records. */
  async append(...turns: TurnInput[]): Promise<Schemas["AppendBatchResponse"]> {
    return this.appendWith(turns);
  }

  /** `append` with call options (an abort signal, a timeout). */
  async appendWith(turns: TurnInput[], options?: CallOptions): Promise<Schemas["AppendBatchResponse"]> {
    if (this.#closed) throw new Error("the session is closed");
    const sent = turns.map((t) => this.#turn(t));
    const answer = await this.agent.conversation.appendBatch({ turns: sent }, options);
    this.transcriptStored = answer.results.every((r) => r.reason !== "logging_disabled");
    answer.results.forEach((result, i) => {
      const turn = sent[i]!;
      this.#buffer.push({ role: turn.role, content: turn.content, msg_id: result.msg_id });
    });
    if (this.#buffer.length >= this.flushEvery) await this.flush(options);
    return answer;
  }

  /** Hand the buffered turns to extraction now (null when nothing is buffered). */
  async flush(options?: CallOptions): Promise<ResponseOf<"memory.set_from_messages"> | null> {
    if (this.#buffer.length === 0) return null;
    const messages = this.#buffer;
    this.#buffer = [];
    try {
      return await this.agent.memory.setFromMessages(
        { ...this.#user(), session_id: this.sessionId, messages, defer: true },
        options,
      );
    } catch (exc) {
      this.#buffer = [...messages, ...this.#buffer]; // nothing lost: the next flush sends them
      throw exc;
    }
  }

  /** Flush the buffered turns to extraction; the session takes no more appends. */
  async close(options?: CallOptions): Promise<ResponseOf<"memory.set_from_messages"> | null> {
    const out = await this.flush(options);
    this.#closed = true;
    return out;
  }

  #turn(turn: TurnInput): Schemas["TurnIn"] {
    const out: Schemas["TurnIn"] = { thread_id: this.threadId, ...turn };
    if (this.userId && out.user_id === undefined) out.user_id = this.userId;
    out.metadata = { environment: this.agent.environment, ...turn.metadata };
    return out;
  }

  #user(): { user_id?: string } {
    return this.userId ? { user_id: this.userId } : {};
  }
}
