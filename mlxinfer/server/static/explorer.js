// The explorer page: the prompt and sampler shared by every view, the views as tabs, the model card.
//
// A view is a module with mount(ctx) -> { run() }: it reads the prompt and settings from ctx, talks to
// the server through api.js, and writes into its own <section id="view-ID">. VIEWS lists them in the
// page's order; the server's card says which it serves (card.views), and the page shows only those.

import { getJson, initKey, setKey } from "./api.js";
import * as answers from "./answers.js";
import * as draws from "./draws.js";
import { el, fixed, thousands } from "./format.js";
import * as generate from "./generate.js";
import * as next from "./next.js";

// follows: the shared inputs a view's result depends on (the next-token table re-draws itself as the sampler moves)
const PROMPT = ["prompt", "chat", "system"];
const CUT = ["top-k", "top-p", "min-p"];
const VIEWS = [
  { id: "next-token", tab: "tab-next", section: "view-next", module: next, follows: PROMPT },
  { id: "answers", tab: "tab-answers", section: "view-answers", module: answers, follows: [...PROMPT, ...CUT] },
  { id: "draws", tab: "tab-draws", section: "view-draws", module: draws, follows: [...PROMPT, "temp", ...CUT] },
  { id: "generate", tab: "tab-generate", section: "view-generate", module: generate, follows: [...PROMPT, "temp", ...CUT] },
];

const $ = (id) => document.getElementById(id);

function number(id, fallback) {
  const v = $(id).valueAsNumber;
  return Number.isFinite(v) ? v : fallback;
}

// What a view's result was computed from: the shared inputs it follows and its own controls, as text.
function inputsOf(view) {
  // a control marked data-display changes only how the page shows the result (the draws' grouping)
  const own = [...$(view.section).querySelectorAll(".view-controls :is(input, select):not([data-display])")];
  return JSON.stringify([...view.follows.map($), ...own].map((e) => (e.type === "checkbox" ? e.checked : e.value)));
}

// A result shown under inputs that have changed since is marked as stale (dimmed, with a note), so that the
// table and the command line beside it (which follows the inputs) are never read as one run.
const results = new Map();  // view -> the inputs of the result it shows

function markStale() {
  for (const [view, from] of results) $(view.section).classList.toggle("stale", from !== inputsOf(view));
}

const ctx = {
  card: null,
  prompt: () => {
    const chat = $("chat").checked;
    const system = $("system").value;
    return { prompt: $("prompt").value, chat, system: chat && system ? system : null };
  },
  // the sampler's settings as /v1 and /mlxinfer/next-token take them (always all four: the page's
  // defaults are the sampler's "off", so the server's generation_config.json does not fill them)
  settings: () => ({
    temperature: number("temp", NaN),  // a blank T is refused where it is checked, not read as 1
    top_k: number("top-k", 0),  // as typed: 2.7 is refused as the CLI refuses it (was: silently 2)
    top_p: number("top-p", 1),
    min_p: number("min-p", 0),
  }),
  secondTemperature: () => number("temp2", NaN),
  // at the start of a run: returns the function the view calls once it shows that run's result
  begin(id) {
    const view = VIEWS.find((v) => v.id === id);
    const from = inputsOf(view);
    return () => {
      results.set(view, from);
      markStale();
    };
  },
  showError(error) {
    const box = $("error");
    const named = error && error.param && !error.message.startsWith(error.param);  // was: "top_p: top_p must ..."
    box.textContent = error ? `${named ? error.param + ": " : ""}${error.message}` : "";
    box.hidden = !error;
    if (error) $("status").textContent = "";  // the last run's line would read as this one's (was: "scored in ...")
  },
  status(text) {
    $("status").textContent = text;
  },
  onSettings: [],  // views that redraw when the sampler's controls move (no request)
  onShared: [],  // views that follow any shared input: the prompt, its options, the sampler
};

function bindSampler() {
  const range = $("temp-range");
  const box = $("temp");
  const changed = () => ctx.onSettings.forEach((fn) => fn());
  range.addEventListener("input", () => {
    box.value = range.value;
    changed();
  });
  box.addEventListener("input", () => {
    if (Number.isFinite(box.valueAsNumber)) range.value = String(Math.min(2, box.valueAsNumber));
    changed();
  });
  for (const id of ["temp2", "top-k", "top-p", "min-p"]) $(id).addEventListener("input", changed);
  $("chat").addEventListener("change", () => {
    $("system").disabled = !$("chat").checked;
  });
  for (const box of [$("prompt-form"), $("sampler")]) {
    box.addEventListener("input", () => ctx.onShared.forEach((fn) => fn()));
  }
  document.addEventListener("input", markStale);
  document.addEventListener("change", markStale);
}

function bindCopy() {
  document.addEventListener("click", async (e) => {
    const button = e.target.closest("button.copy");
    if (!button) return;
    try {
      await navigator.clipboard.writeText($(button.dataset.copy).textContent);
      ctx.status("copied");
    } catch {
      ctx.status("the browser did not allow copying: select the text instead");
    }
  });
}

function bindTabs(views) {
  const tabs = views.map((v) => $(v.tab));
  const select = (tab, focus) => {
    for (const t of tabs) {
      const on = t === tab;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      $(t.getAttribute("aria-controls")).hidden = !on;
    }
    if (focus) tab.focus();
  };
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => select(tab, false));
    tab.addEventListener("keydown", (e) => {
      const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
      if (to === undefined) return;
      e.preventDefault();
      select(tabs[(to + tabs.length) % tabs.length], true);
    });
  });
  return () => views[tabs.findIndex((t) => t.getAttribute("aria-selected") === "true")];
}

function renderCard(card) {
  const c = card.count || {};
  const s = card.system || {};
  const mb = (bytes) => `${fixed(bytes / 1e6, 1)} MB`;
  const size = c.total
    ? `${fixed(c.total / 1e6, 1)}M parameters · ${mb(c.bytes)} at ${c.dtype}` + (c.stored ? ` · ${mb(c.stored.tensor_bytes)} stored` : "")
    : c.error || "not counted";
  const on = (part, yes, no) => (part ? (part.active ? yes : `${no} (${part.reason})`) : "");
  const rows = [
    ["runs", `${card.definition} (${card.architecture}) · ${card.compute_dtype} path: ${card.weights}`],
    ["size", size],
    ["machine", s.platform ? `${s.platform.system} ${s.platform.machine} · MLX ${s.mlx.version}, ${s.mlx.default_device}` : ""],
  ];
  const more = [
    ["model", card.name],
    ["vocabulary", `${thousands(card.vocab_size)} tokens · context ${thousands(card.context)}`],
    ["BLAS", s.blas ? on(s.blas, s.blas.library, s.blas.library) : ""],
    ["quantized matmul", on(s.quantized_matmul, "the batch-invariant kernel", "not in use")],
    ["batched draw", on(s.batched_draw, "one native call", "row by row")],
    ["server", `${card.server.max_rows} rows in flight · ${card.server.max_queue} requests queued at most`],
  ];
  const list = (pairs) => el("dl", {}, ...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("card").replaceChildren(
    el("p", { class: "name" }, card.model),
    list(rows),
    el("details", {}, el("summary", {}, "more"), list(more)),
  );
}

function startSampler(sampler) {  // the controls start where a request that sets nothing would sample
  $("temp").value = $("temp-range").value = String(sampler.temperature);
  $("top-k").value = String(sampler.top_k);
  $("top-p").value = String(sampler.top_p);
  $("min-p").value = String(sampler.min_p);
  $("sampler-note").textContent = `· started from ${sampler.note.replace(/^sampling: /, "")}`;
}

async function loadCard() {
  try {
    ctx.card = await getJson("/mlxinfer/card");
  } catch (e) {
    $("card").replaceChildren(el("p", { class: "muted" }, `no model card: ${e.message}`));
    if (e.status !== 401) ctx.showError(e);
    return false;
  }
  renderCard(ctx.card);
  return true;
}

async function main() {
  initKey();
  bindSampler();
  bindCopy();
  window.addEventListener("need-key", () => {
    $("key-form").hidden = false;
    $("key").focus();
  });
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    setKey($("key").value.trim());
    ctx.showError(null);
    if (await loadCard()) {
      $("key-form").hidden = true;
      start();
    } else if (!$("key-form").hidden) {  // was: the form simply stayed, as if the key had not been tried
      ctx.showError(new Error("the server refused this key; check it and enter it again"));
    }
  });
  $("prompt-form").addEventListener("submit", (e) => {  // was: before the key, Run did nothing, silently
    e.preventDefault();
    if (!started) ctx.showError(new Error("enter the server's API key first (above)"));
  });
  if (await loadCard()) start();
}

let started = false;

function start() {
  if (started) return;
  started = true;
  startSampler(ctx.card.sampler);
  const views = VIEWS.filter((v) => ctx.card.views.includes(v.id));
  for (const v of VIEWS) if (!views.includes(v)) $(v.tab).hidden = true;
  const mounted = new Map(views.map((v) => [v, v.module.mount(ctx)]));
  const active = bindTabs(views);
  const busy = new Set();  // views whose run is in flight: Run waits for the shown view's own
  const run = async () => {
    const view = active();
    if (busy.has(view)) return;  // was: eight quick clicks (or a held Enter) sent eight requests
    ctx.showError(null);
    busy.add(view);
    $("run").disabled = true;
    try {
      await mounted.get(view).run();
    } finally {
      busy.delete(view);
      $("run").disabled = busy.has(active());
    }
  };
  for (const kind of ["click", "keyup"]) {  // another tab: Run is free unless that view's own run is in flight
    document.querySelector(".tabs").addEventListener(kind, () => ($("run").disabled = busy.has(active())));
  }
  for (const v of views) {  // Enter in a view's own fields or the sampler's runs it, as the Run button does
    $(v.section).insertBefore(
      el("p", { class: "stale-note" }, "Changed since the result below (the command line follows the inputs): run it again to update it."),
      $(v.section).querySelector(".view-controls").nextSibling,
    );
    $(v.section).querySelector(".view-controls").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.repeat && e.target.matches("input:not([type=checkbox]), select")) {
        e.preventDefault();
        run();
      }
    });
  }
  $("sampler").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.repeat && e.target.matches("input:not([type=range])")) {
      e.preventDefault();
      run();
    }
  });
  $("prompt-form").addEventListener("submit", (e) => {
    e.preventDefault();
    run();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.repeat && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      run();
    }
  });
  document.body.dataset.ready = "true";  // for scripts and tests: the views are mounted
}

main();
