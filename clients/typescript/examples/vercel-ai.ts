/**
 * A chat turn with the Vercel AI SDK, its memory in Loom: the prompt is what Loom holds
 * for the session (the user's facts, the thread's recent turns, a brief when named), and
 * the exchange is recorded back to the thread (and, through the session, to extraction).
 *
 *     LOOM_TOKEN=$(.venv/bin/loom token mint --namespace dev --role writer) \
 *     AI_GATEWAY_API_KEY=... node build/examples/vercel-ai.js "Where do invoices go now?"
 */

import { pathToFileURL } from "node:url";

import { generateText } from "ai";
import type { LanguageModel } from "ai";

import { Agent } from "@loom-memory/client";
import { LoomChatMemory } from "@loom-memory/client/ai-sdk";

/** One answer to `input`, remembered. */
export async function reply(memory: LoomChatMemory, model: LanguageModel, input: string): Promise<string> {
  const result = await generateText({ model, ...(await memory.prompt(input)) });
  await memory.record(input, result);
  return result.text;
}

async function main(input: string): Promise<void> {
  const bot = new Agent("dev", "local", "support-bot");
  const memory = new LoomChatMemory(bot.session("thread-42", { userId: "u1" }), {
    instructions: "You are the billing team's support bot.",
  });
  console.log(await reply(memory, "openai/gpt-5-mini", input)); // a model through the AI Gateway
  await memory.session.close(); // hands the buffered turns to extraction
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await main(process.argv.slice(2).join(" ") || "Where do invoices go now?");
}
