// The sampler's arithmetic on one row of scores, in the page, as mlxinfer/sampler.py computes it in its
// "temperature-first" order: divide the scores by T (written s * (1/T) in float32, as MLX does), softmax
// over the whole vocabulary, then cut the tail of the tempered distribution -- top-k, then top-p on what
// top-k left (rescaled), then min-p -- and rescale what is kept to 1. T = 0 keeps the top token alone.
// The scores come from one forward pass (POST /mlxinfer/next-token); everything here re-draws from them,
// so a slider never asks the model again. Sums run in float64 where MLX sums in float32: the printed
// digits agree, and a token exactly at a cut's edge can fall either side.

export function decodeScores(scores) {
  const bytes = Uint8Array.from(atob(scores.base64), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(scores.count);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);  // little-endian on any host
  return out;
}

export class Row {
  constructor(scores) {
    this.scores = scores;  // Float32Array (V,)
    // best first; equal scores by id, as a stable sort of -scores (the table's argsort) orders them
    this.order = Uint32Array.from(scores.keys()).sort((a, b) => scores[b] - scores[a] || a - b);
  }

  get size() {
    return this.scores.length;
  }

  // log-probabilities at temperature T > 0: x - logsumexp(x), x = float32(s * float32(1 / T))
  logprobs(T) {
    const inv = Math.fround(1 / T);
    const x = new Float64Array(this.size);
    let max = -Infinity;
    for (let i = 0; i < x.length; i++) {
      x[i] = Math.fround(this.scores[i] * inv);
      if (x[i] > max) max = x[i];
    }
    let sum = 0;
    for (let i = 0; i < x.length; i++) sum += Math.exp(x[i] - max);
    const shift = max + Math.log(sum);
    for (let i = 0; i < x.length; i++) x[i] -= shift;
    return x;
  }

  // softmax(s / T) over the whole vocabulary; T = 0 puts all of it on the top token
  probs(T) {
    if (T === 0) {
      const p = new Float64Array(this.size);
      p[this.order[0]] = 1;
      return p;
    }
    const lp = this.logprobs(T);
    for (let i = 0; i < lp.length; i++) lp[i] = Math.exp(lp[i]);
    return lp;
  }

  // What the sampler keeps at these settings ({temperature, top_k, top_p, min_p}) and each token's
  // probability after the cut: sampler.cut_tail, then engine/tables.explain's rescaling.
  cut({ temperature: T, top_k = 0, top_p = 1, min_p = 0 }) {
    const V = this.size;
    const probs = this.probs(T);
    const kept = new Uint8Array(V);
    if (T === 0) {
      kept[this.order[0]] = 1;
    } else if (!(top_k > 0 || top_p < 1 || min_p > 0)) {
      kept.fill(1);
    } else {
      const lp = this.logprobs(T);
      const alive = (i) => lp[i] > -Infinity;
      if (top_k > 0 && top_k < V) {
        for (let r = top_k; r < V; r++) lp[this.order[r]] = -Infinity;
      }
      if (top_p < 1) this.#topP(lp, top_p);
      if (min_p > 0) {
        const floor = lp[this.order[0]] + Math.log(min_p);
        for (let i = 0; i < V; i++) if (lp[i] < floor) lp[i] = -Infinity;
      }
      for (let i = 0; i < V; i++) kept[i] = alive(i) ? 1 : 0;
    }
    let mass = 0;
    let n = 0;
    for (let i = 0; i < V; i++) {
      if (kept[i]) {
        mass += probs[i];
        n += 1;
      }
    }
    return { probs, kept, nKept: n, massKept: mass, massCut: 1 - mass, final: (i) => (kept[i] ? probs[i] / mass : 0) };
  }

  // apply_top_p: walking down from the best, a token survives while the mass above it is below
  // p * (the row's mass); every token at or above the last survivor's log-probability survives.
  #topP(lp, p) {
    let total = 0;
    for (let r = 0; r < this.size; r++) total += Math.exp(lp[this.order[r]]);
    let above = 0;
    let last = this.order[0];
    for (let r = 0; r < this.size; r++) {
      const i = this.order[r];
      if (above >= p * total) break;
      last = i;
      above += Math.exp(lp[i]);
    }
    const threshold = lp[last];
    for (let i = 0; i < this.size; i++) if (lp[i] < threshold) lp[i] = -Infinity;
  }
}

// The answer a completion counts as, by the rule `mlxinfer sample --group` names (engine/grouping.py):
// "first-word" is the first word (letters and digits, with inner apostrophes and hyphens), case-folded;
// "text" the whole text stripped of surrounding space. A text with no word in it is its own answer.
const WORD = /[\p{L}\p{N}]+(?:['’-][\p{L}\p{N}]+)*/u;
export function answerKey(text, group) {
  if (group === "first-word") {
    const word = WORD.exec(text);
    // Python's casefold: "Straße" and "STRASSE" alike; and a final sigma folds to σ (JS lowercases it to ς)
    if (word) return word[0].toUpperCase().toLowerCase().replaceAll("ς", "σ");
  }
  return text.trim();
}

// Wilson's score interval for k successes in n draws (95%: z = 1.96): where the share would settle
// with many more draws, honest for small n and for shares near 0 or 1.
export function wilson(k, n, z = 1.959963984540054) {
  if (n === 0) return [0, 1];
  const p = k / n;
  const z2 = z * z;
  const centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const half = (z * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n))) / (1 + z2 / n);
  return [Math.max(0, centre - half), Math.min(1, centre + half)];
}

// settings.py's checks, in its words: the first setting that is out of range, or null.
const RULES = [
  ["temperature", (v) => v === 0 || v >= 1e-6, ">= 0 (0 = greedy, else at least 1e-06; e.g. 0.7)"],
  ["top_p", (v) => v > 0 && v <= 1, "in (0, 1] (1 = off; e.g. 0.9)"],
  ["top_k", (v) => Number.isInteger(v) && v >= 0, "a whole number >= 0 (0 = off; e.g. 20)"],
  ["min_p", (v) => v >= 0 && v < 1, "in [0, 1) (0 = off; e.g. 0.05)"],
];

export function problem(settings, name) {
  for (const [field, ok, rule] of RULES) {
    if (!(field in settings)) continue;
    const v = settings[field];
    if (!Number.isFinite(v) || !ok(v)) return `${name || field} must be ${rule}, got ${Number.isNaN(v) ? "nothing" : v}`;
  }
  return null;
}
