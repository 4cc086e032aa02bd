import { Briefs, Conversation, Erasure, Memory, Namespaces, Ops, Saved, Settings, Webhooks } from "./ops.js";
import type { CallWith, OpCaller } from "./ops.js";
import { Transport } from "./transport.js";
import type { CallOptions, ClientOptions } from "./transport.js";
import { FILLS } from "./types.js";
import type { Body, OpName, RequestOf, ResponseOf } from "./types.js";

export interface LoomClientOptions extends ClientOptions {
  /** The namespace a call goes to when its body names none. */
  namespace?: string;
  /** The calling agent's name, for the bodies that take an `agent`. */
  agent?: string;
}

/** Every op of one Loom API, as one token: typed methods in groups, and `call` for any op by name. */
export class LoomClient implements OpCaller {
  readonly transport: Transport;
  readonly conversation = new Conversation(this);
  readonly saved = new Saved(this);
  readonly memory = new Memory(this);
  readonly briefs = new Briefs(this);
  readonly erasure = new Erasure(this);
  readonly namespaces = new Namespaces(this);
  readonly ops = new Ops(this);
  readonly settings = new Settings(this);
  readonly webhooks = new Webhooks(this);
  readonly #scope: { namespace?: string; agent?: string };

  constructor(options: LoomClientOptions = {}) {
    const { namespace, agent, ...transport } = options;
    this.transport = new Transport(transport);
    this.#scope = { namespace, agent };
  }

  /** Any op by name: `await client.call("memory.search", { user_id: "u-7", query: "..." })`.
   * Retried on 503 and lost connections unless `idempotent: false`. */
  async call<Op extends OpName>(op: Op, body: Body<Op>, options?: CallWith): Promise<ResponseOf<Op>> {
    return (await this.transport.call(op, this.body(op, body), options)) as ResponseOf<Op>;
  }

  /** An op answering NDJSON (erasure.export), a row at a time. */
  lines<Op extends OpName>(op: Op, body: Body<Op>, options?: CallOptions): AsyncGenerator<Record<string, unknown>> {
    return this.transport.lines(op, this.body(op, body), options);
  }

  /** The body as sent: the client's namespace and agent where the op takes them and the
   * caller left them out. */
  body<Op extends OpName>(op: Op, body: Body<Op>): RequestOf<Op> {
    const out: Record<string, unknown> = { ...body };
    const fills = FILLS[op];
    for (const name of ["namespace", "agent"] as const) {
      const value = this.#scope[name];
      if (fills[name] && value !== undefined && out[name] === undefined) out[name] = value;
    }
    return out as RequestOf<Op>;
  }
}
