// Whole answers: every complete answer's exact probability, as `mlxinfer answers` walks them (POST
// /mlxinfer/answers): one column per temperature, the cut of the sampler above (top-k, top-p, min-p)
// applied to each. The server walks the tree of tokens best-first on its engine, a batch of paths per
// step, and answers once: one request a run. The remainder row is what the walk did not resolve; it
// bounds every answer not listed and what a listed one could still gain. An answer's button (click, or
// Enter) shows its most likely token paths with each step's probability. Numbers as the CLI prints them.

import { checkPrompt, commandLine, postJson } from "./api.js";
import { barCell, el, fixed, g, pyRepr, thousands, wholeNumber as whole } from "./format.js";

const SHOWN = 20;  // answers listed; the rest are summed in one row, as in the CLI's table
const DIGITS = 4;  // the CLI's precision (cli/commands/answers.py)

const $ = (id) => document.getElementById(id);
const p4 = (x) => fixed(x, DIGITS);

function temperatures(most) {
  const words = $("ans-temps").value.split(/[\s,]+/).filter(Boolean);
  const temps = words.map(Number);
  const decimal = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;  // what Python's float reads (was: "0x10" read as 16)
  if (!temps.length || words.some((w) => !decimal.test(w)) || temps.some((t) => !Number.isFinite(t) || t < 0)) {
    throw new Error("temperatures must be numbers >= 0, separated by commas: 0.5,1,1.5");
  }
  if (temps.length > most) throw new Error(`temperatures takes at most ${most}`);
  return temps;
}

function minMass() {
  const m = $("ans-mass").valueAsNumber;
  if (!(m > 0 && m <= 1)) throw new Error("min mass must be in (0, 1] (1: walk until complete)");
  return m;
}

// `answers`' header for a settings entry: p @ T=..., and the cut when there is one
function label(s) {
  const cut = [["top_k", 0], ["top_p", 1], ["min_p", 0]].filter(([k, off]) => s[k] !== off).map(([k]) => `${k} ${s[k]}`);
  return [`p @ T=${g(s.temperature)}`, cut.join(", ")];
}

export function mount(ctx) {
  const server = ctx.card.server;
  const defaults = ctx.card.defaults;
  $("ans-temps").value = defaults.temperatures.map(String).join(",");
  $("ans-mass").value = String(defaults.min_mass);
  $("ans-max").max = String(server.max_answer_tokens);
  $("ans-nodes").max = String(server.max_answer_nodes);
  let controller = null;
  let shown = null;  // the report on show

  const inputs = () => ({
    temps: temperatures(ctx.card.server.max_temperatures),
    max: whole("ans-max", 1, server.max_answer_tokens),
    nodes: whole("ans-nodes", 1, server.max_answer_nodes),
    mass: minMass(),
    group: $("ans-group").value,
  });

  const command = () => {
    try {
      const { temps, max, nodes, mass, group } = inputs();
      const flags = ["--temps", temps.map(String).join(","), "--max-tokens", max, "--min-mass", mass, "--max-nodes", nodes];
      flags.push("--max-seconds", String(server.max_answer_seconds));  // the server's time budget, as here
      flags.push("--batch-size", String(server.answer_batch_size));  // its paths a pass: the same walk, step by step
      if (group !== defaults.group) flags.push("--group", group);
      $("ans-cli").textContent = commandLine(ctx, "answers", flags, { temperature: false });
    } catch {
      $("ans-cli").textContent = "";
    }
  };
  ctx.onShared.push(command);
  $("view-answers").addEventListener("input", command);
  $("ans-group").addEventListener("change", command);
  command();
  $("ans-run").addEventListener("click", () => {
    ctx.showError(null);
    run();
  });
  $("ans-stop").addEventListener("click", () => controller && controller.abort());

  async function run() {
    let given;
    const cut = ctx.settings();  // one cut for every temperature: the sampler's T is not one of them
    delete cut.temperature;
    try {
      given = inputs();
      checkPrompt(ctx, cut);
    } catch (e) {
      ctx.showError(e);
      return;
    }
    if (controller) controller.abort();
    controller = new AbortController();
    const mine = controller;
    command();
    const shows = ctx.begin("answers");
    const p = ctx.prompt();
    const body = {
      prompt: p.prompt, chat: p.chat, temperatures: given.temps, ...cut,
      max_tokens: given.max, min_mass: given.mass, max_nodes: given.nodes, group: given.group,
    };
    if (p.system) body.system = p.system;
    $("ans-run").disabled = true;
    $("ans-stop").disabled = false;
    ctx.status("walking the answers…");
    const started = performance.now();
    try {
      const data = await postJson("/mlxinfer/answers", body, mine.signal);
      render(data);
      shows();
      const r = data.report;
      const seconds = fixed((performance.now() - started) / 1000, 2);
      ctx.status(`walked in ${seconds} s: ${thousands(r.answers.length)} answers, stopped: ${r.stopped}`);
    } catch (e) {
      if (controller !== mine) return;  // a newer run owns the view (was: "stopped" over it)
      if (e.name === "AbortError") ctx.status("stopped");
      else {
        ctx.showError(e);
        ctx.status("");
      }
    } finally {
      if (controller === mine) {
        controller = null;
        $("ans-run").disabled = false;
        $("ans-stop").disabled = true;
      }
    }
  }

  function render(data) {
    const r = data.report;
    shown = r;
    const walked =
      `${thousands(r.nodes)} paths expanded in ${thousands(r.forward_passes)} forward passes, ` +
      `${thousands(r.leaves)} ended; ${fixed(r.kv_bytes / 1e6, 1)} MB of keys and values kept; stopped: ${r.stopped}`;
    $("ans-head").replaceChildren(
      el("strong", {}, r.model),
      ` on ${r.definition} · prompt: ${r.prompt_ids.length} tokens · grouped by ${r.group}, up to ${r.max_tokens} tokens`,
      el("br"),
      el("span", { class: "muted" }, walked),
    );
    const capped = r.stopped === "max_nodes" || r.stopped === "max_seconds";
    $("ans-bound").textContent = bound(r, data.limits);
    $("ans-bound").className = capped ? "head capped" : "head";

    const table = $("ans-table");
    const heads = r.settings.map((s) => {
      const [top, cut] = label(s);
      const under = cut ? [el("br"), el("span", { class: "cut-label" }, cut)] : [];
      return el("th", { scope: "col", class: "col-p" }, top, ...under);
    });
    table.tHead.replaceChildren(
      el(
        "tr",
        {},
        el("th", { scope: "col", class: "text" }, "answer"),
        ...heads,
        el("th", { scope: "col", class: "text col-path" }, "most likely path"),
      ),
    );
    table.tBodies[0].replaceChildren(...r.answers.slice(0, SHOWN).map(answerRow));
    const rows = [];
    const rest = r.answers.slice(SHOWN);
    if (rest.length) {
      const sums = r.settings.map((_, j) => rest.reduce((t, a) => t + a.probs[j], 0));
      rows.push(footRow(`(${thousands(rest.length)} more answers)`, sums, "more"));
    }
    rows.push(footRow("explored", r.mass.map((m) => m.explored), "explored"));
    rows.push(footRow("(not walked: remainder)", r.mass.map((m) => m.remainder), "remainder"));
    table.tFoot.replaceChildren(...rows);
    table.hidden = false;
    const hint = r.answers.length
      ? "Choose an answer (click, or Enter on it) for its token paths and each step's probability."
      : "No answer has ended within the walk: the remainder holds all of the probability.";
    $("ans-path").replaceChildren(el("p", { class: "muted" }, hint));
  }

  function answerRow(a, i) {
    const button = el(
      "button",
      { type: "button", class: "answer", "aria-controls": "ans-path", "aria-expanded": "false" },
      pyRepr(a.answer),
    );
    const path = a.paths.length ? pyRepr(a.paths[0].pieces.join("|")) : "";
    const tr = el(
      "tr",
      { dataset: { index: i } },
      el("td", { class: "text col-answer" }, button),
      ...a.probs.map((p) => barCell("col-p", p, p4(p))),
      el("td", { class: "text col-path" }, path),
    );
    tr.addEventListener("click", () => choose(i));  // the button's click (Enter, Space) comes here too
    return tr;
  }

  function footRow(name, values, kind) {
    return el(
      "tr",
      { class: kind },
      el("th", { scope: "row", class: "text" }, name),
      ...values.map((v) => barCell("col-p", v, p4(v))),
      el("td", { class: "col-path" }),
    );
  }

  function choose(i) {
    const a = shown.answers[i];
    for (const tr of $("ans-table").tBodies[0].rows) {
      const on = Number(tr.dataset.index) === i;
      tr.classList.toggle("chosen", on);
      tr.querySelector("button.answer").setAttribute("aria-expanded", String(on));
    }
    const heads = () => shown.settings.map((s) => el("th", { scope: "col" }, label(s)[0]));
    const which = a.paths.length === 1 ? "its most likely path" : `its ${a.paths.length} most likely paths`;
    const parts = [
      el(
        "h3",
        {},
        "answer ",
        el("span", { class: "mono" }, pyRepr(a.answer)),
        el("span", { class: "muted" }, ` · ${which}; each step's probability given the tokens before it`),
      ),
    ];
    a.paths.forEach((path, k) => parts.push(pathTable(path, k, heads())));
    const texts = Object.entries(a.texts);
    if (texts.length > 1 || (texts.length === 1 && texts[0][0] !== a.answer)) {
      const rows = texts.map(([text, probs]) =>
        el("tr", {}, el("td", { class: "text" }, pyRepr(text)), ...probs.map((q) => el("td", {}, p4(q)))),
      );
      const table = el(
        "table",
        { class: "numbers texts" },
        el("thead", {}, el("tr", {}, el("th", { scope: "col", class: "text" }, "text"), ...heads())),
        el("tbody", {}, ...rows),
      );
      const more = a.texts_not_shown ? ` (the ${thousands(texts.length)} most probable; ${thousands(a.texts_not_shown)} more not shown)` : "";
      const said = a.texts_not_shown ? `the texts it holds${more}` : `the ${thousands(texts.length)} texts it holds`;
      parts.push(el("details", {}, el("summary", {}, said), el("div", { class: "scroll" }, table)));
    }
    $("ans-path").replaceChildren(...parts);
  }

  return { run };
}

// One token path: each token, its id and its step's probability under each setting; the path's own below.
function pathTable(path, k, heads) {
  const steps = path.tokens.map((id, t) =>
    el(
      "tr",
      {},
      el("td", {}, String(t + 1)),
      el("td", { class: "text col-token" }, pyRepr(path.pieces[t])),
      el("td", { class: "col-id" }, String(id)),
      ...path.steps[t].map((q) => barCell("col-p", q, p4(q))),
    ),
  );
  const foot = el(
    "tr",
    {},
    el("td"),
    el("th", { scope: "row", class: "text" }, "the path"),
    el("td", { class: "col-id" }),
    ...path.probs.map((q) => el("td", {}, p4(q))),
  );
  const head = el(
    "tr",
    {},
    el("th", { scope: "col" }, "#"),
    el("th", { scope: "col", class: "text" }, "token"),
    el("th", { scope: "col", class: "col-id" }, "id"),
    ...heads,
  );
  return el(
    "div",
    { class: "scroll" },
    el(
      "table",
      { class: "numbers path", dataset: { path: k } },
      el("caption", {}, `path ${k + 1}: ${pyRepr(path.pieces.join(""))}`),
      el("thead", {}, head),
      el("tbody", {}, ...steps),
      el("tfoot", {}, foot),
    ),
  );
}

// What the stop means for the numbers: exact, or bounded by the remainder
function bound(r, limits) {
  const rest = r.mass.map((m) => p4(m.remainder)).join(" / ");
  const bounds = `each listed answer's probability is at least what is shown and at most that plus the remainder (${rest}); an answer not listed has at most the remainder`;
  if (r.stopped === "complete") return "Every path was walked: the probabilities are exact, and under each setting they sum to 1.";
  if (r.stopped === "max_nodes") {
    const cap = r.max_nodes === limits.max_nodes ? ", the server's cap" : "";
    return `The walk stopped at max nodes (${thousands(r.max_nodes)} paths expanded${cap}): ${bounds}.`;
  }
  if (r.stopped === "max_seconds") return `The walk stopped at the server's time budget (${g(limits.max_seconds)} s): ${bounds}.`;
  if (r.stopped === "min_mass") return `The walk resolved the min mass asked for under every setting: ${bounds}.`;
  if (r.stopped === "branches") return `Each path followed its 1,024 likeliest next tokens at most, and the rest kept the min mass out of reach (a top-k or top-p cut makes the walk finite): ${bounds}.`;
  return `The walk was interrupted: ${bounds}.`;
}
