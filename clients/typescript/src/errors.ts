import type { Schemas } from "./types.js";

/**
 * Loom's stable error codes (the `error` of every refusal), and the client's own for a
 * call that never got an answer (status 0): `unreachable` (no connection, after the
 * retries), `timeout` (no answer within `timeoutMs`), `no_token`.
 */
export type LoomErrorCode =
  | "invalid_request" // 422: `field` and `rule` name what the body breaks
  | "unauthorized" // 401: no valid bearer token
  | "forbidden" // 403: the token's role or scope does not allow the op
  | "not_found" // 404: the thread, brief, fact or job the body names does not exist
  | "conflict" // 409: e.g. a brief save with an `if_revision` the brief is not at
  | "body_too_large" // 413
  | "backend_unavailable" // 503: ClickHouse or Redis failed; retried after `Retry-After`
  | "unavailable" // 503: the op could not finish this time; retried
  | "internal" // 500
  | "unreachable"
  | "timeout"
  | "no_token"
  | (string & {}); // a code added by a newer server

export type ErrorItem = Schemas["ErrorItem"];

/** An op refused or failed. `message` is the API's own, safe to show. */
export class LoomError extends Error {
  override readonly name = "LoomError";

  constructor(
    /** The HTTP status; 0 when the call never got an answer. */
    readonly status: number,
    readonly error: LoomErrorCode,
    message: string,
    /** The offending field (a dotted path) of a 4xx for bad input. */
    readonly field: string | null = null,
    /** The rule that field breaks. */
    readonly rule: string | null = null,
    /** Every field that failed validation (a 422 may name several). */
    readonly errors: ErrorItem[] = [],
  ) {
    super(message);
  }
}

/** The LoomError a refusal's answer carries (its JSON error body, when it has one). */
export async function errorFrom(r: Response): Promise<LoomError> {
  let body: unknown = null;
  try {
    body = JSON.parse(await r.text());
  } catch {
    // not JSON (a proxy's page): the status says what there is to say
  }
  const b = (body !== null && typeof body === "object" ? body : {}) as Partial<Schemas["ErrorBody"]>;
  return new LoomError(
    r.status,
    typeof b.error === "string" && b.error ? b.error : "http_error",
    typeof b.message === "string" && b.message ? b.message : r.statusText || `HTTP ${r.status}`,
    b.field ?? null,
    b.rule ?? null,
    Array.isArray(b.errors) ? b.errors : [],
  );
}
