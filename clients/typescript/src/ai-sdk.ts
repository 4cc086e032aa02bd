/**
 * A Loom session as the memory of a Vercel AI SDK chat (`generateText`, `streamText`),
 * with no dependency on `ai`: the prompt is plain `{ role, content }` messages and a
 * `system` string, which `ai`'s `ModelMessage` and call options accept as they are.
 *
 *     import { generateText } from "ai";
 *     import { Agent } from "@loom-memory/client";
 *     import { LoomChatMemory } from "@loom-memory/client/ai-sdk";
 *
 *     const bot = new Agent("dev", "local", "support-bot");
 *     const memory = new LoomChatMemory(bot.session("thread-42", { userId: "u1" }));
 *     const input = "Where do invoices go now?";
 *     const result = await generateText({ model, ...(await memory.prompt(input)) });
 *     await memory.record(input, result);
 *
 * `prompt` is one context.pack (the user's facts, from every session, ranked for the
 * input; the thread's transcript tail within the token budget; a brief when one is
 * named); `record` appends the exchange to the thread, and through the session's buffer
 * to memory extraction.
 */

import type { ResumeFields, Session } from "./agent.js";
import type { CallOptions } from "./transport.js";
import type { ResponseOf, Schemas } from "./types.js";

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

/** Spread into `generateText` / `streamText`: `{ model, ...prompt }`. */
export interface ChatPrompt {
  system?: string;
  messages: ChatMessage[];
}

export interface ChatMemoryOptions {
  /** The system prompt's opening paragraph (the agent's own instructions). */
  instructions?: string;
  /** More context.pack fields: `token_budget`, `brief_key`, `include_profile`. */
  resume?: Omit<ResumeFields, "query">;
}

/** The most of the input context.pack takes as its query (the API's limit, in code points). */
const QUERY_MAX_CHARS = 4000;

const HEADINGS: Record<string, string> = {
  brief: "The brief of this line of work:",
  profile: "The user's profile:",
  facts: "What you know about the user:",
  evidence: "From earlier conversations:",
};

export class LoomChatMemory {
  constructor(
    readonly session: Session,
    readonly options: ChatMemoryOptions = {},
  ) {}

  /** The prompt for the next answer to `input`: what Loom holds for the session as
   * `system`, the thread's recent turns, then `input` as the user's message. */
  async prompt(input: string, options?: CallOptions): Promise<ChatPrompt> {
    const { agent, threadId, userId } = this.session;
    const query = Array.from(input).slice(0, QUERY_MAX_CHARS).join("");
    // No session_id: the user's facts from every session, not only this one's.
    const pack = await agent.memory.contextPack(
      { ...this.options.resume, ...(userId ? { user_id: userId } : {}), thread_id: threadId, query },
      options,
    );
    return promptFromPack(pack, input, this.options.instructions);
  }

  /** Record the exchange: `input` as the user's turn, the result's text (a
   * `generateText` result, or `streamText`'s once it has finished) as the assistant's.
   * Both turns take their ids from the result's `response.id`, so recording the same
   * result again adds nothing, while two answers with the same words are two turns (a
   * turn sent without an id is known by its words). */
  async record(
    input: string,
    result: ModelResult,
    options?: CallOptions,
  ): Promise<Schemas["AppendBatchResponse"]> {
    const [text, response] = await Promise.all([result.text, result.response]);
    const id = response?.id || uniqueId();
    return this.session.appendWith(
      [
        { role: "user", content: input, msg_id: `${id}.user` },
        { role: "assistant", content: text, msg_id: `${id}.assistant` },
      ],
      options,
    );
  }
}

/** What `record` reads of a `generateText` or `streamText` result. */
export interface ModelResult {
  text: string | PromiseLike<string>;
  response?: { id?: string } | PromiseLike<{ id?: string }>;
}

function uniqueId(): string {
  return globalThis.crypto?.randomUUID?.() ?? `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

/** A context.pack answer as a chat prompt: every section but the transcript in `system`
 * (after `instructions`), the transcript's turns as messages, then `input` (if given). */
export function promptFromPack(
  pack: ResponseOf<"context.pack">,
  input?: string,
  instructions?: string,
): ChatPrompt {
  const paragraphs = instructions ? [instructions] : [];
  const messages: ChatMessage[] = [];
  for (const section of pack.sections) {
    if (section.name === "transcript") {
      messages.push(...section.items.map((item) => asMessage(item.text)));
    } else if (section.items.length > 0) {
      const heading = HEADINGS[section.name] ?? `${section.name}:`;
      paragraphs.push([heading, ...section.items.map((item) => `- ${item.text}`)].join("\n"));
    }
  }
  if (input !== undefined) messages.push({ role: "user", content: input });
  return paragraphs.length > 0 ? { system: paragraphs.join("\n\n"), messages } : { messages };
}

/** A transcript item (`"<role>: <text>"`, the role one of user, assistant, system) as a message. */
function asMessage(text: string): ChatMessage {
  const found = /^(user|assistant|system): /.exec(text);
  if (!found) return { role: "user", content: text };
  return { role: found[1] as ChatMessage["role"], content: text.slice(found[0].length) };
}
