// Seeded draws: N seeds drawn by the server's own engine, batched and streamed in as they finish.
// One /v1 request (stream, seed, n) holds up to the server's rows in flight, row i drawing with seed
// seed + i; more seeds are more requests, sent together, which the engine batches as rows free up.
// Each draw can be asked for again alone (n = 1, its own seed): on a batch-invariant compute path it
// comes back the same, which is what a seed promises. The tally groups the answers by the rule
// `mlxinfer sample --group` names (the first word, case and punctuation folded, by default; or the whole
// text) with Wilson's 95% interval for each share, and lists the texts each answer holds.

import { checkPrompt, commandLine, openaiRequest, postJson, streamJson } from "./api.js";
import { el, percent, pyRepr, wholeNumber as whole } from "./format.js";
import { answerKey, wilson } from "./sampler.js";

const $ = (id) => document.getElementById(id);

export function mount(ctx) {
  let draws = [];
  let controller = null;
  const command = () => {
    try {
      const n = whole("draw-n", 1);
      const base = whole("draw-base", 0);
      const max = whole("draw-max", 1);
      const group = $("draw-group").value;
      const extra = group === ctx.card.defaults.group ? [] : ["--group", group];
      $("draw-cli").textContent = commandLine(ctx, "sample", ["--seeds", `${base}:${base + n}`, "--max-tokens", max, ...extra]);
    } catch {
      $("draw-cli").textContent = "";
    }
  };
  ctx.onShared.push(command);
  $("view-draws").addEventListener("input", command);
  command();
  $("draw-group").addEventListener("change", () => tally());
  $("draw-run").addEventListener("click", () => {
    ctx.showError(null);
    run();
  });

  async function run() {
    let n, base, max;
    try {
      n = whole("draw-n", 1, Number($("draw-n").max));  // was: 10,000 seeds froze the tab
      base = whole("draw-base", 0);
      max = whole("draw-max", 1);
      checkPrompt(ctx, ctx.settings(), { v1: true });
    } catch (e) {
      ctx.showError(e);
      return;
    }
    if (controller) controller.abort();
    controller = new AbortController();
    const mine = controller;
    const signal = controller.signal;
    command();
    ctx.begin("draws")();  // the table is this run's from here on, filled as the draws come
    draws = Array.from({ length: n }, (_, i) => row(base + i));
    $("draw-table").tBodies[0].replaceChildren(...draws.map((d) => d.tr));
    $("draw-table").hidden = false;
    tally();
    const per = ctx.card.server.max_request_rows;
    const batches = [];
    for (let at = 0; at < n; at += per) batches.push(draws.slice(at, at + per));
    $("draw-head").textContent =
      `${n} seeds from ${base}, ${batches.length} request${batches.length > 1 ? "s" : ""} of up to ${per} rows`;
    ctx.status("drawing…");
    const started = performance.now();
    try {
      await Promise.all(batches.map((rows) => drawBatch(rows, max, signal)));
      ctx.status(`${n} draw${n > 1 ? "s" : ""} in ${((performance.now() - started) / 1000).toFixed(2)} s`);
    } catch (e) {
      if (controller !== mine) return;  // a newer run owns the view (was: its status blanked)
      if (e.name !== "AbortError") ctx.showError(e);
      ctx.status("");
      for (const d of draws.filter((d) => d.finish === null)) {  // was: "…" for ever
        d.textCell.textContent = e.name === "AbortError" ? "stopped" : "failed";
      }
    }
  }

  async function drawBatch(rows, max, signal) {
    const { path, body } = openaiRequest(ctx, { max_tokens: max, seed: rows[0].seed, n: rows.length });
    for (const d of rows) d.asked = { path, body: { ...body, seed: d.seed, n: 1 } };  // "again" asks the same
    for await (const chunk of streamJson(path, body, signal)) {
      for (const c of chunk.choices || []) {
        const d = rows[c.index];
        d.text += (c.delta ? c.delta.content : c.text) || "";
        d.textCell.textContent = pyRepr(d.text);
        if (c.finish_reason) {
          d.finish = c.finish_reason;
          d.endCell.textContent = d.finish;
          d.again.disabled = false;
          tally();
        }
      }
    }
  }

  function row(seed) {
    const d = { seed, text: "", finish: null };
    d.textCell = el("td", { class: "text col-text" }, "…");
    d.endCell = el("td", { class: "text col-end" });
    d.again = el("button", { type: "button", class: "small", disabled: true, title: `draw seed ${seed} again, alone` }, "again");
    d.aloneCell = el("td", { class: "text col-alone" }, d.again);
    d.again.addEventListener("click", () => alone(d));
    d.tr = el("tr", { dataset: { seed } }, el("td", { class: "col-seed" }, String(seed)), d.textCell, d.endCell, d.aloneCell);
    return d;
  }

  async function alone(d) {
    d.again.disabled = true;
    const { path, body } = d.asked;  // the draw's own request (was: the controls as they are now)
    try {
      const r = await postJson(path, body);
      const c = r.choices[0];
      const text = c.message ? c.message.content ?? "" : c.text;
      d.aloneCell.className = `text col-alone ${text === d.text ? "same" : "differs"}`;
      d.aloneCell.replaceChildren(text === d.text ? "same" : `differs: ${pyRepr(text)}`);
    } catch (e) {
      ctx.showError(e);
      d.again.disabled = false;
    }
  }

  function tally() {
    const done = draws.filter((d) => d.finish !== null);
    const group = $("draw-group").value;
    const counts = new Map();
    const texts = new Map();
    for (const d of done) {
      const key = answerKey(d.text, group);
      counts.set(key, (counts.get(key) || 0) + 1);
      if (!texts.has(key)) texts.set(key, new Set());
      texts.get(key).add(d.text);
    }
    const rows = [...counts].sort((a, b) => b[1] - a[1]);  // stable: equal counts stay in seed order
    const table = $("tally-table");
    table.hidden = done.length === 0;
    table.caption.textContent = `${done.length} of ${draws.length} draws; 95% intervals (Wilson)`;
    table.tBodies[0].replaceChildren(
      ...rows.map(([answer, k]) => {
        const [lo, hi] = wilson(k, done.length);
        const share = k / done.length;
        const bar = el("span", { class: "bar", "aria-hidden": "true" });
        bar.style.width = `${share * 100}%`;
        const whisker = el("span", { class: "whisker", "aria-hidden": "true" });
        whisker.style.left = `${lo * 100}%`;
        whisker.style.width = `${(hi - lo) * 100}%`;
        return el(
          "tr",
          {},
          el("td", { class: "text col-answer", title: [...texts.get(answer)].map(pyRepr).join("\n") }, pyRepr(answer)),
          el("td", { class: "col-count" }, String(k)),
          el("td", { class: "col-share" }, percent(share)),
          el("td", { class: "col-interval" }, `${percent(lo)} – ${percent(hi)}`),
          el("td", { class: "p drawn" }, bar, whisker),
        );
      }),
    );
  }

  return { run };
}
