/**
 * The client's one way to call Loom: `POST /v1/<op>` with a bearer token over `fetch`
 * (Node 18+, browsers, edge runtimes), the API's error body thrown as {@link LoomError},
 * and retries where a retry is safe.
 *
 * A retry is safe for an idempotent call (every read; an append, idempotent by its
 * msg_id; a save, by its message id). The API answers 503 with `Retry-After` while a
 * backend restarts; a failed connection means the API itself is restarting. Either is
 * retried with backoff (doubling, at least `Retry-After`, at most `maxBackoffMs`), up to
 * `attempts` calls in all, then thrown. A call that times out is not repeated: it may
 * still be running on the server.
 */

import { LoomError, errorFrom } from "./errors.js";

/** The client's environment, read where there is one (Node): the API's address and a token. */
export const ENV_URL = "LOOM_URL";
export const ENV_TOKEN = "LOOM_TOKEN";
export const DEFAULT_URL = "http://127.0.0.1:7777";

const RETRY_STATUSES = new Set([502, 503, 504]);

export interface RetryOptions {
  /** Calls in all, the first included (default 5). */
  attempts?: number;
  /** The first wait between two calls (default 250 ms); doubled each time. */
  firstBackoffMs?: number;
  /** The longest wait, whatever `Retry-After` says (default 5000 ms). */
  maxBackoffMs?: number;
}

export interface ClientOptions {
  /** The API's address; default `LOOM_URL`, else http://127.0.0.1:7777. */
  baseUrl?: string;
  /** A bearer token (`loom token mint`); default `LOOM_TOKEN`. */
  token?: string;
  /** How long one call may wait for its answer (default 60000 ms; 0: no limit). */
  timeoutMs?: number;
  retry?: RetryOptions;
  /** The `fetch` to call with (default the global one). */
  fetch?: typeof fetch;
}

/** Per call: an abort signal (the call throws the signal's reason) and a timeout. */
export interface CallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

interface Answered {
  value: unknown;
}
interface Refused {
  error: LoomError;
  retryable: boolean;
  retryAfterMs: number;
}

function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return proc?.env?.[name];
}

export class Transport {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly retry: Required<RetryOptions>;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl || env(ENV_URL) || DEFAULT_URL).replace(/\/+$/, "");
    const token = options.token || env(ENV_TOKEN) || "";
    if (!token) throw new LoomError(0, "no_token", `no token: pass one, or set ${ENV_TOKEN}`);
    this.#headers = {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
      accept: "application/json",
    };
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.retry = { attempts: 5, firstBackoffMs: 250, maxBackoffMs: 5_000, ...options.retry };
    const found = options.fetch ?? globalThis.fetch;
    if (typeof found !== "function") throw new TypeError("no fetch: pass options.fetch");
    this.#fetch = found.bind(globalThis);
  }

  /** POST the op; its JSON answer, or a LoomError (after the retries, when `idempotent`). */
  async call(op: string, body: unknown, options: CallOptions & { idempotent?: boolean } = {}): Promise<unknown> {
    const attempts = options.idempotent === false ? 1 : Math.max(1, this.retry.attempts);
    let backoff = this.retry.firstBackoffMs;
    for (let attempt = 1; ; attempt++) {
      const outcome = await this.#attempt(op, body, options);
      if ("value" in outcome) return outcome.value;
      if (!outcome.retryable || attempt >= attempts) throw outcome.error;
      backoff = Math.max(backoff, outcome.retryAfterMs);
      await sleep(Math.min(backoff, this.retry.maxBackoffMs), options.signal);
      backoff *= 2;
    }
  }

  /** POST the op and yield its NDJSON answer a line at a time, never held whole (not
   * retried: a stream half read cannot be resumed; the caller runs it again). The
   * timeout bounds the wait for the answer to start. */
  async *lines(op: string, body: unknown, options: CallOptions = {}): AsyncGenerator<Record<string, unknown>> {
    const limit = new Deadline(options.signal, options.timeoutMs ?? this.timeoutMs);
    let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
    try {
      const r = await this.#post(op, body, limit);
      if (!(r instanceof Response)) throw r.error;
      if (!r.ok) throw await errorFrom(r);
      limit.stopTimer();
      if (!r.body) {
        yield* parseLines(await r.text());
        return;
      }
      reader = r.body.getReader();
      const decoder = new TextDecoder();
      let pending = "";
      for (;;) {
        const { done, value } = await reader.read();
        pending += done ? decoder.decode() : decoder.decode(value, { stream: true });
        const end = done ? pending.length : pending.lastIndexOf("\n") + 1;
        yield* parseLines(pending.slice(0, end));
        pending = pending.slice(end);
        if (done) return;
      }
    } catch (exc) {
      limit.rethrowIfAborted();
      throw exc;
    } finally {
      limit.dispose();
      if (reader) await reader.cancel().catch(() => undefined);
    }
  }

  async #attempt(op: string, body: unknown, options: CallOptions): Promise<Answered | Refused> {
    const limit = new Deadline(options.signal, options.timeoutMs ?? this.timeoutMs);
    try {
      const r = await this.#post(op, body, limit);
      if (!(r instanceof Response)) return r;
      if (r.ok) return { value: await r.json() };
      return {
        error: await errorFrom(r),
        retryable: RETRY_STATUSES.has(r.status),
        retryAfterMs: retryAfterMs(r.headers.get("retry-after")),
      };
    } catch (exc) {
      limit.rethrowIfAborted();
      throw exc;
    } finally {
      limit.dispose();
    }
  }

  /** The answer, or (when no answer came) the retryable `unreachable` refusal. */
  async #post(op: string, body: unknown, limit: Deadline): Promise<Response | Refused> {
    limit.rethrowIfAborted();
    try {
      return await this.#fetch(`${this.baseUrl}/v1/${op}`, {
        method: "POST",
        headers: this.#headers,
        body: JSON.stringify(body),
        signal: limit.signal,
      });
    } catch (exc) {
      limit.rethrowIfAborted();
      const error = new LoomError(0, "unreachable", `${this.baseUrl}: ${describe(exc)}`);
      return { error, retryable: true, retryAfterMs: 0 };
    }
  }
}

/** One call's signal: aborted by the caller's signal or by the timeout, and which it was. */
class Deadline {
  readonly signal: AbortSignal;
  readonly #controller = new AbortController();
  readonly #caller: AbortSignal | undefined;
  readonly #ms: number;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timedOut = false;

  constructor(caller: AbortSignal | undefined, ms: number) {
    this.signal = this.#controller.signal;
    this.#caller = caller;
    this.#ms = ms;
    if (caller?.aborted) this.#controller.abort(caller.reason);
    caller?.addEventListener("abort", this.#onAbort);
    if (ms > 0 && Number.isFinite(ms)) {
      this.#timer = setTimeout(() => {
        this.#timedOut = true;
        this.#controller.abort(this.#timeoutError());
      }, ms);
    }
  }

  readonly #onAbort = (): void => this.#controller.abort(this.#caller?.reason);

  #timeoutError(): LoomError {
    return new LoomError(0, "timeout", `no answer within ${this.#ms} ms`);
  }

  /** The caller's abort reason, or the timeout, when either ended the call. */
  rethrowIfAborted(): void {
    if (this.#caller?.aborted) throw this.#caller.reason;
    if (this.#timedOut) throw this.#timeoutError();
  }

  stopTimer(): void {
    clearTimeout(this.#timer);
  }

  dispose(): void {
    this.stopTimer();
    this.#caller?.removeEventListener("abort", this.#onAbort);
  }
}

function* parseLines(text: string): Generator<Record<string, unknown>> {
  for (const line of text.split("\n")) {
    if (line.trim()) yield JSON.parse(line) as Record<string, unknown>;
  }
}

/** `Retry-After` in ms: seconds, or an HTTP date; 0 when absent or unreadable. */
export function retryAfterMs(value: string | null): number {
  if (!value) return 0;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? 0 : Math.max(0, at - Date.now());
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A failed connection, named by its kind (ECONNREFUSED...), never with a header. */
function describe(exc: unknown): string {
  const cause = (exc as { cause?: { code?: unknown; message?: unknown } } | null)?.cause;
  if (typeof cause?.code === "string") return cause.code;
  if (typeof cause?.message === "string") return cause.message;
  return exc instanceof Error ? exc.message || exc.name : "fetch failed";
}
