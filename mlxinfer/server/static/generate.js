// Generate: the model writes, streamed from /v1 with each token's log-probability (before temperature
// and cut, as the engine reports it), shaded: the less likely the token, the stronger. The seed is always
// sent (a blank seed is drawn here), so the text can be had again: the same request as an `mlxinfer
// generate` command line, a curl call and the openai client's, ready to copy.

import { checkPrompt, commandLine, hasKey, openaiRequest, streamJson } from "./api.js";
import { el, fixed, pyRepr, shellQuote, wholeNumber as whole } from "./format.js";

const $ = (id) => document.getElementById(id);
const TOP = 5;  // alternatives per token

function randomSeed() {  // below 2**53: the page's numbers hold it exactly
  const [hi, lo] = crypto.getRandomValues(new Uint32Array(2));
  return (hi & 0x1fffff) * 2 ** 32 + lo;
}

function entries(choice) {  // a chunk's tokens as [{token, logprob, top: [[text, logprob]]}], chat or not
  const lp = choice.logprobs;
  if (!lp) return [];
  if (lp.content) return lp.content.map((e) => ({ ...e, top: e.top_logprobs.map((t) => [t.token, t.logprob]) }));
  return lp.tokens.map((token, i) => ({ token, logprob: lp.token_logprobs[i], top: Object.entries(lp.top_logprobs[i] || {}) }));
}

export function mount(ctx) {
  let controller = null;
  let lastSeed = null;

  const seedWanted = () => {
    const v = $("gen-seed").valueAsNumber;
    return Number.isInteger(v) && v >= 0 && v <= Number.MAX_SAFE_INTEGER ? v : null;
  };
  const seedTyped = () => $("gen-seed").value.trim() !== "" || $("gen-seed").validity.badInput;
  const maxTokens = () => {  // a blank box: what the snippets say too (was: null sent, the server's default)
    const v = $("gen-max").valueAsNumber;
    return Number.isInteger(v) && v > 0 ? v : 64;
  };
  const maxTyped = () => $("gen-max").value.trim() !== "" || $("gen-max").validity.badInput;
  const snippets = () => {
    try {
      writeSnippets();
    } catch {  // a setting the server would refuse: no snippet for it
      for (const id of ["gen-cli", "gen-curl", "gen-python"]) $(id).textContent = "";
    }
  };
  const writeSnippets = () => {
    const seed = seedWanted() ?? lastSeed;
    const max = maxTokens();
    const flags = ["--max-tokens", max, ...(seed === null ? [] : ["--seed", seed])];
    $("gen-cli").textContent = commandLine(ctx, "generate", flags);
    const { path, body } = openaiRequest(ctx, { max_tokens: max, ...(seed === null ? {} : { seed }) });
    const url = `${location.origin}${path}`;
    const auth = hasKey() ? ` \\\n  -H "Authorization: Bearer $MLXINFER_API_KEY"` : "";
    $("gen-curl").textContent =
      `curl ${url} \\\n  -H 'Content-Type: application/json'${auth} \\\n  -d ${shellQuote(JSON.stringify(body))}`;
    $("gen-python").textContent = python(path, body);
  };
  ctx.onShared.push(snippets);
  $("view-generate").addEventListener("input", snippets);
  snippets();

  $("gen-run").addEventListener("click", () => {
    ctx.showError(null);
    run();
  });
  $("gen-stop").addEventListener("click", () => controller && controller.abort());

  async function run() {
    if ($("gen-run").disabled) return;  // a run in flight (was: Ctrl+Enter during a click's run sent another)
    if (seedTyped() && seedWanted() === null) {  // was: a random seed drawn in its place, silently
      ctx.showError(new Error(`seed must be a whole number from 0 to ${Number.MAX_SAFE_INTEGER}, or blank`));
      return;
    }
    try {
      if (maxTyped()) whole("gen-max", 1);  // was: 0, -3 or 2.5 silently 64
      checkPrompt(ctx, ctx.settings(), { v1: true });
    } catch (e) {
      ctx.showError(e);
      return;
    }
    if (controller) controller.abort();
    const mine = new AbortController();
    controller = mine;
    const seed = seedWanted() ?? randomSeed();
    lastSeed = seed;
    snippets();
    const max = maxTokens();
    const chat = ctx.prompt().chat;
    const logprobs = chat ? { logprobs: true, top_logprobs: TOP } : { logprobs: TOP };
    const extra = { max_tokens: max, seed, n: 1, ...logprobs, stream_options: { include_usage: true } };
    const { path, body } = openaiRequest(ctx, extra);
    const out = $("gen-text");
    const tokens = $("gen-tokens").tBodies[0];
    out.replaceChildren();
    tokens.replaceChildren();
    ctx.begin("generate")();  // the text is this run's from here on, written as it comes
    $("gen-legend").hidden = false;
    $("gen-details").hidden = false;
    $("gen-head").textContent = `seed ${seed} · writing…`;
    ctx.status("writing…");
    $("gen-run").disabled = true;
    $("gen-stop").disabled = false;
    let count = 0;
    let finish = "";
    try {
      for await (const chunk of streamJson(path, body, mine.signal)) {
        if (chunk.usage) count = chunk.usage.completion_tokens;
        for (const c of chunk.choices || []) {
          const text = (c.delta ? c.delta.content : c.text) || "";
          const list = entries(c);
          if (text) out.append(piece(text, list));
          for (const e of list) tokens.append(tokenRow(tokens.rows.length + 1, e));
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
      $("gen-head").textContent = `seed ${seed} · ${count} tokens · finish: ${finish}`;
      ctx.status(`${count} tokens written`);  // was: the last draws' line stayed
    } catch (e) {
      if (controller !== mine) return;  // a newer run owns the view now (was: its header and buttons reset)
      $("gen-head").textContent = `seed ${seed} · ${e.name === "AbortError" ? "stopped" : "failed"}`;
      ctx.status("");
      if (e.name !== "AbortError") ctx.showError(e);
    } finally {
      if (controller === mine) {
        $("gen-run").disabled = false;
        $("gen-stop").disabled = true;
      }
    }
  }

  return { run };
}

function piece(text, list) {
  const span = el("span", {}, text);
  if (list.length) {
    const p = Math.exp(list.reduce((sum, e) => sum + e.logprob, 0));
    span.dataset.p = p.toFixed(6);
    span.style.setProperty("--unlikely", (1 - p).toFixed(4));
    span.title = list.map((e) => `${pyRepr(e.token)} p ${fixed(Math.exp(e.logprob), 3)}`).join("\n");
  }
  return span;
}

function tokenRow(i, e) {  // as `mlxinfer generate --logprobs` prints it
  const alts = e.top.map(([t, lp]) => `${pyRepr(t)} ${fixed(lp, 3)}`).join("  ");
  return el(
    "tr",
    {},
    el("td", {}, String(i)),
    el("td", { class: "text" }, pyRepr(e.token)),
    el("td", {}, fixed(Math.exp(e.logprob), 3)),
    el("td", {}, fixed(e.logprob, 3)),
    el("td", { class: "text" }, alts),
  );
}

function python(path, body) {
  const chat = path.endsWith("chat/completions");
  const { model, ...rest } = body;
  const standard = ["messages", "prompt", "max_tokens", "seed", "temperature", "top_p", "n"];
  const args = Object.entries(rest).filter(([k]) => standard.includes(k));
  const extra = Object.fromEntries(Object.entries(rest).filter(([k]) => !standard.includes(k)));
  const lines = [
    "import os",
    "from openai import OpenAI",
    "",
    "client = OpenAI(",
    `    base_url="${location.origin}/v1",`,
    '    api_key=os.environ.get("MLXINFER_API_KEY", "none"),',
    ")",
    "# top_k and min_p are the toolkit's sampler fields, beside OpenAI's: extra_body",
    `r = client.${chat ? "chat.completions" : "completions"}.create(`,
    `    model=${JSON.stringify(model)},`,
    ...args.map(([k, v]) => `    ${k}=${pyValue(v)},`),
    `    extra_body=${pyValue(extra)},`,
    ")",
    `print(r.choices[0].${chat ? "message.content" : "text"})`,
  ];
  return lines.join("\n");
}

function pyValue(v) {  // JSON -> a Python literal
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (Array.isArray(v)) return `[${v.map(pyValue).join(", ")}]`;
  if (typeof v === "object") return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${pyValue(x)}`).join(", ")}}`;
  return JSON.stringify(v);  // a JSON string or number is a Python literal too
}
