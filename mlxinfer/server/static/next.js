// Next token: one forward pass (POST /mlxinfer/next-token), read as `mlxinfer topk --explain` reads it:
// the top rows by score, their probability at T and at a second temperature T2, what the sampler's cut
// keeps and each kept token's probability after it. The response carries every score of the vocabulary,
// so moving T, T2 or a cut re-draws the table here (sampler.js) without another request.

import { checkPrompt, commandLine, postJson } from "./api.js";
import { barCell, barWidth, el, fixed, g, pyRepr, thousands, wholeNumber as whole } from "./format.js";
import { decodeScores, problem, Row } from "./sampler.js";

const $ = (id) => document.getElementById(id);

export function mount(ctx) {
  let shown = null;  // { table, row: Row, cells: [{p1, p2, kept, final, tr}] }

  ctx.onSettings.push(() => {
    if (shown) redraw();
  });
  const command = () => {  // the same table from the command line, following the inputs
    try {
      const T = ctx.settings().temperature;
      const T2 = ctx.secondTemperature();
      if (problem({ temperature: T2 }, "T2")) throw new Error("T2");
      const rows = $("rows").value.trim() === "" ? 10 : whole("rows", 1, 200);
      const temps = T === T2 ? `${T}` : `${T},${T2}`;  // as typed, as --temp is (the header rounds to 6 digits)
      $("next-cli").textContent = commandLine(ctx, "topk", ["--explain", "--rows", rows, "--temps", temps]);
    } catch {
      $("next-cli").textContent = "";
    }
  };
  ctx.onShared.push(command);
  ctx.onSettings.push(command);
  $("view-next").addEventListener("input", command);
  command();
  $("next-run").addEventListener("click", () => {
    ctx.showError(null);
    run();
  });

  async function run() {
    if ($("next-run").disabled) return;  // a run in flight (was: Ctrl+Enter during a click's run sent another)
    let k = 10;  // a blank box: the page's ten rows
    try {
      if ($("rows").value.trim() !== "" || $("rows").validity.badInput) k = whole("rows", 1, 200);
      checkPrompt(ctx, {});  // the sampler's settings are checked with T2 below
    } catch (e) {  // was: 0 or -5 silently became 10
      ctx.showError(e);
      return;
    }
    const p = ctx.prompt();
    const settings = ctx.settings();
    const bad = invalid(settings, ctx.secondTemperature());
    if (bad) {  // was: a blank T went out as null, and the server's default answered
      ctx.showError(new Error(bad));
      return;
    }
    const shows = ctx.begin("next-token");
    const body = {
      prompt: p.prompt,
      chat: p.chat,
      k,
      // one column where T2 = T (was: refused, "temperatures lists 0.5 more than once")
      temperatures: [...new Set([settings.temperature, ctx.secondTemperature()])],
      ...settings,
    };
    if (p.system) body.system = p.system;
    const button = $("next-run");
    button.disabled = true;
    ctx.status("one forward pass…");
    const started = performance.now();
    try {
      const data = await postJson("/mlxinfer/next-token", body);
      shown = build(data.table, new Row(decodeScores(data.scores)));
      redraw();
      shows();
      ctx.status(`scored in ${fixed((performance.now() - started) / 1000, 2)} s; ${agreement(data.table, shown.row)}`);
    } catch (e) {
      ctx.showError(e);
      ctx.status("");
    } finally {
      button.disabled = false;
    }
  }

  function build(table, row) {
    $("next-head").replaceChildren(
      el("strong", {}, table.model),
      `  prompt: ${table.prompt_ids.length} tokens · scores in one pass of ${table.definition}: ${thousands(table.n_scores)}`,
      el("br"),
      el("span", { class: "muted" }, "prompt "),
      el("span", { class: "mono", id: "next-prompt" }, shortened(table.prompt)),
    );
    const body = $("next-table").tBodies[0];
    const cells = table.rows.map((r) => {
      const c = {
        p1: barCell("col-p1", 0, ""),
        p2: barCell("col-p2", 0, ""),
        kept: el("td", { class: "col-kept" }),
        final: barCell("col-final", 0, ""),
      };
      c.tr = el(
        "tr",
        { dataset: { id: r.id } },
        el("td", {}, String(r.rank)),
        el("td", { class: "text col-token" }, pyRepr(r.text ?? "")),
        el("td", { class: "col-id" }, String(r.id)),
        el("td", { class: "col-score" }, fixed(r.score, 2)),
        c.p1,
        c.p2,
        c.kept,
        c.final,
      );
      c.id = r.id;
      return c;
    });
    body.replaceChildren(...cells.map((c) => c.tr));
    $("next-table").hidden = false;
    return { table, row, cells };
  }

  function redraw() {
    const settings = ctx.settings();
    const T2 = ctx.secondTemperature();
    const bad = invalid(settings, T2);
    $("next-table").classList.toggle("dim", Boolean(bad));  // its numbers are the last valid settings'
    $("next-cut").className = bad ? "head error" : "head";
    if (bad) {
      $("next-cut").textContent = `${bad}: the table above is for the last valid settings`;
      return;
    }
    const { row, cells } = shown;
    const p1 = row.probs(settings.temperature);
    const p2 = row.probs(T2);
    const cut = row.cut(settings);
    $("next-th-p1").textContent = `p @ T=${g(settings.temperature)}`;
    $("next-th-p2").textContent = `p @ T=${g(T2)}`;
    const sums = [0, 0, 0];
    for (const c of cells) {
      const kept = cut.kept[c.id] === 1;
      const final = cut.final(c.id);
      setBar(c.p1, p1[c.id], fixed(p1[c.id], 3));
      setBar(c.p2, p2[c.id], fixed(p2[c.id], 3));
      setBar(c.final, final, kept ? fixed(final, 3) : "");
      c.kept.textContent = kept ? "yes" : "cut";
      c.tr.classList.toggle("cut", !kept);
      sums[0] += p1[c.id];
      sums[1] += p2[c.id];
      sums[2] += final;
    }
    const foot = $("next-table").tFoot;
    foot.querySelector(".col-p1").textContent = fixed(sums[0], 3);
    foot.querySelector(".col-p2").textContent = fixed(sums[1], 3);
    foot.querySelector(".col-final").textContent = fixed(sums[2], 3);
    $("next-cut").replaceChildren(
      el("strong", {}, `the sampler at T=${g(settings.temperature)}: keeps ${thousands(cut.nKept)} of ${thousands(row.size)} tokens`),
      ` · mass kept ${fixed(cut.massKept, 3)}, cut off ${fixed(Math.max(0, cut.massCut), 3)}, then rescaled to 1`,
    );
  }

  return { run };
}

// What is wrong with the sampler's settings and the second temperature, or null
function invalid(settings, T2) {
  return problem(settings) || problem({ temperature: T2 }, "T2");
}

// A long prompt shown in full pushed the table a screen down: its start, and its length
function shortened(prompt) {
  return prompt.length > 300 ? `${pyRepr(prompt.slice(0, 300))} … (${thousands(prompt.length)} characters)` : pyRepr(prompt);
}

function setBar(td, value, text) {
  td.firstChild.style.width = barWidth(value);
  td.lastChild.nodeValue = text;
}

// The page's arithmetic against the server's own table (table_from_scores at the temperatures it was
// asked for): the largest difference, said in the status line.
function agreement(table, row) {
  let worst = 0;
  table.temperatures.forEach((T, j) => {
    const p = row.probs(T);
    for (const r of table.rows) worst = Math.max(worst, Math.abs(p[r.id] - r.probs[j]));
  });
  return `the page's softmax is within ${worst.toExponential(1)} of the server's`;
}
