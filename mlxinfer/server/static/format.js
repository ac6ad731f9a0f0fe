// Numbers and token texts printed as the CLI prints them (cli/commands/topk.py, sample.py): Python's
// f"{x:.3f}" rounding, repr() of a token's text, thousands with commas. Also the DOM helper every view
// uses: text goes in as text (textContent), never as markup.

// Python's format(x, ".Nf"): the exact binary value rounded, ties to even. JavaScript's toFixed breaks
// ties upwards (0.0625 -> "0.063", Python "0.062"); a tie shows as a 5 followed only by zeros.
export function fixed(x, digits) {
  if (!Number.isFinite(x)) return x > 0 ? "inf" : x < 0 ? "-inf" : "nan";
  const a = Math.abs(x);
  const wide = a.toFixed(100);  // exact: every double at or above 2**-48 has at most 100 decimals
  const point = wide.indexOf(".");
  const cut = point + 1 + digits;
  if (!/^50*$/.test(wide.slice(cut))) return x.toFixed(digits);  // no tie: both round to nearest
  const down = digits ? wide.slice(0, cut) : wide.slice(0, point);
  const last = Number(down[down.length - 1]);
  return (x < 0 ? "-" : "") + (last % 2 === 0 ? down : a.toFixed(digits));
}

export function thousands(n) {
  return Number(n).toLocaleString("en-US");
}

export function percent(x) {  // Python's f"{x:.1%}", as sample's tally prints shares (was: .0%, 1 of 256 "0%")
  return fixed(x * 100, 1) + "%";
}

// Python's repr() of a str: quotes chosen as Python chooses them, escapes for what is not printable.
export function pyRepr(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = "";
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === "\\") out += "\\\\";
    else if (ch === quote) out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (isPrintable(ch)) out += ch;
    else if (c < 0x100) out += "\\x" + c.toString(16).padStart(2, "0");
    else if (c < 0x10000) out += "\\u" + c.toString(16).padStart(4, "0");
    else out += "\\U" + c.toString(16).padStart(8, "0");
  }
  return quote + out + quote;
}

const UNPRINTABLE = /^[\p{C}\p{Z}]$/u;  // Python: categories C* and Z* are not printable, the space aside

function isPrintable(ch) {
  return ch === " " || !UNPRINTABLE.test(ch);
}

// el("td", {class: "p"}, "0.412") -- children are strings (set as text) or elements.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A bar's CSS width for a share of its cell (0..1): a full bar leaves a gap to the next cell's.
export function barWidth(value) {
  return `calc(${Math.max(0, Math.min(1, value))} * (100% - 0.5rem))`;
}

// A horizontal bar behind a table cell's number: width is a share of the cell (0..1).
export function barCell(className, value, text) {
  const bar = el("span", { class: "bar", "aria-hidden": "true" });
  bar.style.width = barWidth(value);
  return el("td", { class: `p ${className}` }, bar, text);
}

// Shell words for a copyable command line: single quotes, and a quote inside as '\''.
export function shellQuote(word) {
  const s = String(word);
  return /^[A-Za-z0-9_./:=@%+,-]+$/.test(s) ? s : "'" + s.replaceAll("'", "'\\''") + "'";
}

// A whole-number field's value, or an Error naming its label and the rule: at least `least`, at most `most`
// (the server's cap, where it has one).
export function wholeNumber(id, least, most = Number.MAX_SAFE_INTEGER) {
  const input = document.getElementById(id);
  const v = input.valueAsNumber;
  const name = input.labels[0].textContent;
  if (!Number.isInteger(v) || v < least) throw new Error(`${name} must be a whole number >= ${least}`);
  if (v > most) throw new Error(`${name} is at most ${thousands(most)} on this server`);
  return v;
}

export function g(x) {  // Python's f"{x:g}", for temperatures in headers and command lines (1e-06, not 0.000001)
  const [mantissa, e] = x.toExponential(5).split("e");
  const exp = Number(e);
  if (exp >= -4 && exp < 6) return String(Number(x.toPrecision(6)));
  const sign = exp < 0 ? "-" : "+";
  return `${mantissa.replace(/\.?0+$/, "")}e${sign}${String(Math.abs(exp)).padStart(2, "0")}`;
}
