// The server, from the page: JSON requests and OpenAI's server-sent events, with the API key when the
// server has one. The key is asked for once (a 401 raises "need-key"), kept in this tab's sessionStorage,
// and may arrive in the URL's fragment (#key=..., as `mlxinfer explore --api-key` opens it), which the
// browser never sends to the server; it is taken out of the address bar at once.

import { problem } from "./sampler.js";
import { shellQuote } from "./format.js";

const STORE = "mlxinfer-api-key";
let key = null;

export function initKey() {
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.has("key")) {
    setKey(hash.get("key"));
    history.replaceState(null, "", location.pathname + location.search);
  } else {
    key = sessionStorage.getItem(STORE);
  }
}

export function setKey(value) {
  key = value || null;
  if (key) sessionStorage.setItem(STORE, key);
  else sessionStorage.removeItem(STORE);
}

export function hasKey() {
  return key !== null;
}

export class ServerError extends Error {
  constructor(status, body) {
    const e = body && body.error ? body.error : {};
    super(e.message || `the server answered ${status}`);
    this.status = status;
    this.param = e.param || null;
  }
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function checked(response) {
  if (response.ok) return response;
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (response.status === 401) window.dispatchEvent(new CustomEvent("need-key"));
  throw new ServerError(response.status, body);
}

// fetch, a failure to reach the server said as such (was: the browser's bare "Failed to fetch")
async function send(path, init) {
  try {
    return await fetch(path, init);
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new Error(`the server at ${location.host} did not answer (${e.message}); is mlxinfer serve still running?`);
  }
}

export async function getJson(path) {
  const response = await checked(await send(path, { headers: headers(false) }));
  return response.json();
}

export async function postJson(path, body, signal) {
  const init = { method: "POST", headers: headers(true), body: JSON.stringify(body), signal };
  const response = await checked(await send(path, init));
  return response.json();
}

// POST with stream: true; yields each event's JSON until [DONE]. An error event (the engine failed after
// the stream began) is thrown as a ServerError.
export async function* streamJson(path, body, signal) {
  const init = { method: "POST", headers: headers(true), body: JSON.stringify({ ...body, stream: true }), signal };
  const response = await checked(await send(path, init));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const parsed = JSON.parse(data);
        if (parsed.error) throw new ServerError(500, parsed);
        yield parsed;
      }
    }
  }
}

// The prompt and the sampler's settings before a request, refused as the CLI refuses them: a blank prompt (the
// chat template alone would be drawn from), a prompt a chat template rendered already (it would be wrapped
// again: tokenizer._check_not_templated; /v1 would take it as text), a blank T (it would go out as null: the
// server's default). v1: the request goes through /v1, whose temperature keeps OpenAI's range, 0 to 2.
export function checkPrompt(ctx, settings = ctx.settings(), { v1 = false } = {}) {
  const p = ctx.prompt();
  if (!p.prompt.trim()) throw new Error("prompt is empty; give the text to read");
  const opener = p.chat ? templated(p.prompt, ctx.card.control_tokens || []) : null;
  if (opener) {
    throw new Error(
      `the prompt opens with ${opener}, a control token's name: it looks rendered by a chat template already, ` +
        "which would wrap it again; give the message's text alone",
    );
  }
  const bad = problem(settings);
  if (bad) throw new Error(bad);
  if (v1 && settings.temperature > 2) {
    throw new Error(
      `temperature must be at most 2 in this view, got ${settings.temperature}: it asks the server's OpenAI API ` +
        "(/v1), which keeps OpenAI's range; Next token and Whole answers take any T",
    );
  }
}

// The control token a rendered prompt opens with (and holds another), or null: the library's rule
function templated(prompt, names) {
  const head = prompt.trimStart();
  const opener = names.find((t) => head.startsWith(t));
  if (opener === undefined) return null;
  const count = names.reduce((n, t) => n + prompt.split(t).length - 1, 0);
  return count >= 2 ? opener : null;
}

// The /v1 request body for the shared prompt: chat messages (with the system text first), or the text
// alone for /v1/completions when the chat template is off.
export function openaiRequest(ctx, extra) {
  const p = ctx.prompt();
  const body = { model: ctx.card.model, ...ctx.settings(), ...extra };
  if (!p.chat) return { path: "/v1/completions", body: { ...body, prompt: p.prompt } };
  const messages = p.system ? [{ role: "system", content: p.system }] : [];
  messages.push({ role: "user", content: p.prompt });
  return { path: "/v1/chat/completions", body: { ...body, messages } };
}

// The same request as an `mlxinfer` command line (what the CLI would run on this model and path).
// temperature: false where the flags carry the temperatures themselves (answers' --temps).
export function commandLine(ctx, command, flags, { temperature = true } = {}) {
  const p = ctx.prompt();
  const s = ctx.settings();
  if (!temperature) delete s.temperature;
  const bad = problem(s);
  if (bad) throw new Error(bad);  // a snippet of a setting the CLI would refuse (was: --temp NaN): none
  const words = ["mlxinfer", command, "--prompt", p.prompt];
  if (!p.chat) words.push("--no-chat");
  if (p.system) words.push("--system", p.system);
  words.push(...flags);
  if (temperature) words.push("--temp", s.temperature);
  words.push("--top-k", s.top_k, "--top-p", s.top_p, "--min-p", s.min_p);
  if (ctx.card.cli_model) words.push("--model", ctx.card.cli_model);
  words.push("--compute-dtype", ctx.card.compute_dtype);
  return words.map(shellQuote).join(" ");
}
