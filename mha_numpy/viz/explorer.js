// mha_numpy attention explorer: head view, model view, neuron view.
// Plain JavaScript and SVG, no libraries, no network. The data (written by mha_numpy/viz/explorer.py) is the
// JSON in the script element with id "explorer-data":
//   qtok, ktok       query and key tokens
//   layers, heads    layer names, number of heads
//   attn[l][h]       attention weights in thousandths, row-major (Lq, Lk)
//   masks, maskIndex distinct masks as '0'/'1' strings (1 = blocked); maskIndex[l][h] = index or -1
//   neuron           null, or {d, scale, q[l][h], qStep[l][h], k[l][h], kStep[l][h], vnorm[l][h] or null,
//                    terms, mask}
//                    q, k: row-major (L, d) ints, two base-64 characters each (int + 2048 = 64·hi + lo);
//                    the value is int * step
//                    terms: the additive score terms besides q·k × scale, [{name, maps, index}]; mask: a float
//                    mask's finite values, {maps, index} or null. maps: distinct row-major (Lq, Lk) floats,
//                    index[l][h] = the map of that layer and head or -1 (all zero)
// Text from the data (tokens, title, layer names) goes into the page as text nodes and attribute values only.
"use strict";

const D = JSON.parse(document.getElementById("explorer-data").textContent);
const LQ = D.qtok.length;
const LK = D.ktok.length;
const H = D.heads;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];
const state = {
  view: "head",
  layer: 0,
  visible: Array.from({ length: H }, () => true),
  threshold: 0.01,   // lines below this weight are not drawn
  focus: null,       // {side: "q" | "k", index} while a token is hovered or pinned
  pinned: false,
  nHead: 0,          // neuron view: head and query
  nQuery: 0,
  valueWeighted: false,
};

// ------------------------------------------------------------------ small helpers

function el(tag, attrs, parent, text) {
  const svg = ["svg", "line", "text", "tspan", "rect", "g", "title"].includes(tag);
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function headColor(h) {
  return h < COLORS.length ? COLORS[h] : `hsl(${(h * 137) % 360}, 60%, 45%)`;
}

function weight(l, h, i, j) {           // the attention weight, 0..1
  return D.attn[l][h][i * LK + j] / 1000;
}

function blocked(l, h, i, j) {          // true when the mask blocks query i -> key j
  const m = D.maskIndex[l][h];
  return m >= 0 && D.masks[m][i * LK + j] === "1";
}

function fullyMasked(l, h, i) {         // every key of query i blocked: zero weights
  for (let j = 0; j < LK; j++) if (!blocked(l, h, i, j)) return false;
  return true;
}

function visibleHeads() {
  return state.visible.map((v, h) => (v ? h : -1)).filter((h) => h >= 0);
}

function fmt(x, digits) {
  if (!Number.isFinite(x)) return x > 0 ? "∞" : "−∞";
  return Math.abs(x) >= 1e5 ? x.toExponential(digits - 1) : x.toFixed(digits);
}

const LABEL_MAX = 32;  // characters of a token or name shown; a longer one ends in "…" (its tooltip has it all)

function label(text) {
  const chars = Array.from(text);  // code points, so that a character is never cut in half
  return chars.length > LABEL_MAX ? chars.slice(0, LABEL_MAX - 1).join("") + "…" : text;
}

function termValue(t, l, h, i, j) {   // a term {maps, index} at query i, key j (0 where it has no map)
  const m = t.index[l][h];
  return m < 0 ? 0 : t.maps[m][i * LK + j];
}

// ------------------------------------------------------------------ page skeleton

document.title = D.title;  // as text (the <title> in the HTML has it too, escaped)
const root = el("div", { id: "explorer" }, document.body);
el("h1", {}, root, D.title);
const tabs = el("div", { class: "tabs" }, root);
for (const [view, caption] of [["head", "Head view"], ["model", "Model view"], ["neuron", "Neuron view"]]) {
  const b = el("button", { id: `tab-${view}`, "data-view": view }, tabs, caption);
  b.addEventListener("click", () => show(view));
}
const controls = el("div", { class: "controls" }, root);
const layerLabel = el("label", {}, controls, "layer ");
const layerSelect = el("select", { id: "layer" }, layerLabel);
D.layers.forEach((name, l) => el("option", { value: l, title: name }, layerSelect, label(name)));
layerSelect.addEventListener("change", () => { state.layer = +layerSelect.value; render(); });
const thrLabel = el("label", {}, controls, " draw weights ≥ ");
const thrInput = el("input", { id: "threshold", type: "number", min: "0", max: "1", step: "0.01",
                              value: String(state.threshold) }, thrLabel);
thrInput.addEventListener("change", () => { state.threshold = Math.max(0, +thrInput.value || 0); render(); });

const views = {};
for (const view of ["head", "model", "neuron"]) views[view] = el("section", { id: `${view}-view` }, root);

// ------------------------------------------------------------------ head view

const headBar = el("div", { id: "heads", class: "heads" }, views.head);
el("span", {}, headBar, "heads: ");
for (let h = 0; h < H; h++) {
  const label = el("label", { class: "head-toggle", style: `border-color:${headColor(h)}` }, headBar);
  const box = el("input", { type: "checkbox", "data-head": h }, label);
  box.checked = true;
  box.addEventListener("change", () => { state.visible[h] = box.checked; render(); });
  el("span", { class: "swatch", style: `background:${headColor(h)}` }, label);
  el("span", {}, label, ` ${h}`);
}
for (const [id, on] of [["all-heads", true], ["no-heads", false]]) {
  const b = el("button", { id, class: "small" }, headBar, on ? "all" : "none");
  b.addEventListener("click", () => { setHeads(() => on); render(); });
}
el("p", { class: "hint" }, views.head,
   "Lines go from each query (left) to the keys it attends to (right); opacity = weight. Hover a token to see " +
   "only its lines, click to pin it. Grey struck-through keys are masked; ⊘ marks a fully masked query (zero weights).");
const ROW = 20;
const GAP = 244;  // px between the query and the key labels, where the lines go
const svg = el("svg", { id: "head-svg", width: 560, height: Math.max(LQ, LK) * ROW + 40 }, views.head);
const layout = { qx: 150, kx: 410 };  // the right edge of the query labels, the left edge of the keys

function setHeads(pick) {
  for (let h = 0; h < H; h++) state.visible[h] = pick(h);
  headBar.querySelectorAll("input[data-head]").forEach((box) => { box.checked = state.visible[+box.dataset.head]; });
}

function tokenText(side, index) {
  const tok = (side === "q" ? D.qtok : D.ktok)[index];
  const t = el("text", { y: 30 + index * ROW, "text-anchor": side === "q" ? "end" : "start", class: `tok ${side}`,
                        "data-index": index }, svg);
  el("title", {}, t, tok);  // the tooltip: the whole token
  el("tspan", { class: "label" }, t, label(tok));
  t.addEventListener("mouseenter", () => { if (!state.pinned) { state.focus = { side, index }; drawLines(); } });
  t.addEventListener("mouseleave", () => { if (!state.pinned) { state.focus = null; drawLines(); } });
  t.addEventListener("click", () => {
    const same = state.focus && state.focus.side === side && state.focus.index === index;
    state.pinned = !(state.pinned && same);
    state.focus = state.pinned ? { side, index } : null;
    drawLines();
  });
  return t;
}

function widest(texts, prefix) {         // px of the widest label (measured; estimated when not rendered)
  return Math.max(40, ...texts.map((t) => {
    const s = t.querySelector("tspan");
    const text = s.textContent;
    s.textContent = prefix + text;
    const w = t.getComputedTextLength() || 8 * Array.from(s.textContent).length;
    s.textContent = text;
    return w;
  }));
}

function drawHeadView() {
  svg.replaceChildren();
  const qAxis = el("text", { y: 12, "text-anchor": "end", class: "axis" }, svg, "query");
  const kAxis = el("text", { y: 12, class: "axis" }, svg, "key");
  el("g", { id: "lines" }, svg);
  const qs = D.qtok.map((_, i) => tokenText("q", i));
  const ks = D.ktok.map((_, j) => tokenText("k", j));
  layout.qx = 10 + widest(qs, "⊘ ");  // room for the fully-masked mark
  layout.kx = layout.qx + GAP + 16;
  svg.setAttribute("width", layout.kx + widest(ks, "") + 10);
  for (const t of [qAxis, ...qs]) t.setAttribute("x", layout.qx);
  for (const t of [kAxis, ...ks]) t.setAttribute("x", layout.kx);
  drawLines();
}

function drawLines() {
  const g = svg.querySelector("#lines");
  g.replaceChildren();
  const l = state.layer;
  const heads = visibleHeads();
  const f = state.focus;
  const minInt = Math.round(state.threshold * 1000);
  let count = 0;
  const spread = Math.min(1.5, 12 / Math.max(1, heads.length));  // px between heads, so that lines do not hide
  heads.forEach((h, rank) => {
    const off = (rank - (heads.length - 1) / 2) * spread;
    for (let i = 0; i < LQ; i++) {
      if (f && f.side === "q" && f.index !== i) continue;
      for (let j = 0; j < LK; j++) {
        if (f && f.side === "k" && f.index !== j) continue;
        const w = D.attn[l][h][i * LK + j];
        if (w === 0 || w < minInt) continue;
        el("line", { x1: layout.qx + 8, y1: 26 + i * ROW + off, x2: layout.kx - 8, y2: 26 + j * ROW + off,
                     stroke: headColor(h),
                     "stroke-opacity": Math.min(1, 0.1 + w / 1000).toFixed(3), "stroke-width": 2, class: "attn",
                     "data-q": i, "data-k": j, "data-h": h, "data-w": (w / 1000).toFixed(3) }, g);
        count++;
      }
    }
  });
  svg.setAttribute("data-lines", count);
  markTokens(heads);
}

function markTokens(heads) {
  // A key is drawn masked when every visible head blocks it for the focused query (or for all queries);
  // a query is fully masked when every visible head blocks all its keys.
  const l = state.layer;
  const f = state.focus;
  const queries = f && f.side === "q" ? [f.index] : [...Array(LQ).keys()];
  svg.querySelectorAll("text.tok.k").forEach((t) => {
    const j = +t.dataset.index;
    const masked = heads.length > 0 && heads.every((h) => queries.every((i) => blocked(l, h, i, j)));
    t.classList.toggle("masked", masked);
    t.classList.toggle("focus", !!f && f.side === "k" && f.index === j);
  });
  svg.querySelectorAll("text.tok.q").forEach((t) => {
    const i = +t.dataset.index;
    const full = heads.length > 0 && heads.every((h) => fullyMasked(l, h, i));
    t.classList.toggle("fully-masked", full);
    t.querySelector("tspan").textContent = (full ? "⊘ " : "") + label(D.qtok[i]);
    t.classList.toggle("focus", !!f && f.side === "q" && f.index === i);
  });
}

// ------------------------------------------------------------------ model view

const CELL = Math.max(1, Math.floor(72 / Math.max(LQ, LK)));
el("p", { class: "hint" }, views.model,
   "Every layer (rows) and head (columns); rows of a map are queries, columns keys; hatched grey = masked. " +
   "Click a map to open it in the head view.");
const grid = el("div", { id: "model-grid" }, views.model);

function drawThumb(canvas, l, h) {
  const ctx = canvas.getContext("2d");
  for (let i = 0; i < LQ; i++) {
    for (let j = 0; j < LK; j++) {
      if (blocked(l, h, i, j)) {
        ctx.fillStyle = (i + j) % 2 ? "#d0d0d0" : "#9a9a9a";
      } else {
        const w = weight(l, h, i, j);
        const shade = Math.round(255 * (1 - w));
        ctx.fillStyle = `rgb(${shade},${Math.round(255 - 160 * w)},255)`;
      }
      ctx.fillRect(j * CELL, i * CELL, CELL, CELL);
    }
  }
}

function drawModelView() {
  if (grid.childElementCount) return;  // drawn once: the maps do not change
  const table = el("table", {}, grid);
  const head = el("tr", {}, table);
  el("th", {}, head);
  for (let h = 0; h < H; h++) el("th", { style: `color:${headColor(h)}` }, head, `head ${h}`);
  D.layers.forEach((name, l) => {
    const row = el("tr", {}, table);
    el("th", { title: name }, row, label(name));
    for (let h = 0; h < H; h++) {
      const td = el("td", {}, row);
      const c = el("canvas", { class: "thumb", width: LK * CELL, height: LQ * CELL, "data-layer": l, "data-head": h,
                               title: `${name}, head ${h}: click to open in the head view` }, td);
      drawThumb(c, l, h);
      c.addEventListener("click", () => {
        state.layer = l;
        layerSelect.value = String(l);
        setHeads((k) => k === h);
        state.focus = null;
        state.pinned = false;
        show("head");
      });
    }
  });
}

// ------------------------------------------------------------------ neuron view

const neuronBar = el("div", { class: "controls" }, views.neuron);
const nHeadLabel = el("label", {}, neuronBar, "head ");
const nHeadSelect = el("select", { id: "neuron-head" }, nHeadLabel);
for (let h = 0; h < H; h++) el("option", { value: h }, nHeadSelect, String(h));
const nQueryLabel = el("label", {}, neuronBar, " query ");
const nQuerySelect = el("select", { id: "neuron-query" }, nQueryLabel);
D.qtok.forEach((t, i) => el("option", { value: i, title: t }, nQuerySelect, `${i}: ${label(t)}`));
const vwLabel = el("label", {}, neuronBar, " ");
const vwBox = el("input", { id: "value-weighted", type: "checkbox" }, vwLabel);
el("span", {}, vwLabel, " value-weighted: α·‖v W_oᵀ‖");
nHeadSelect.addEventListener("change", () => { state.nHead = +nHeadSelect.value; render(); });
nQuerySelect.addEventListener("change", () => { state.nQuery = +nQuerySelect.value; render(); });
vwBox.addEventListener("change", () => { state.valueWeighted = vwBox.checked; render(); });
const neuronBody = el("div", { id: "neuron-body" }, views.neuron);

const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

function vector(name, l, h, i) {        // the rounded q or k vector as numbers
  const N = D.neuron;
  const packed = N[name][l][h];
  const step = N[name === "q" ? "qStep" : "kStep"][l][h];
  return Array.from({ length: N.d }, (_, c) => {
    const at = 2 * (i * N.d + c);
    return (64 * B64.indexOf(packed[at]) + B64.indexOf(packed[at + 1]) - 2048) * step;
  });
}

function strip(parent, values, cls) {    // a row of small coloured cells, blue < 0 < orange; each holds its number
  const big = Math.max(1e-12, ...values.map(Math.abs));
  const s = el("span", { class: `strip ${cls}` }, parent);
  for (const v of values) {
    const a = Math.min(1, Math.abs(v) / big).toFixed(2);
    const color = v >= 0 ? `rgba(230,120,20,${a})` : `rgba(30,100,200,${a})`;
    el("span", { class: "cell", style: `background:${color}`, "data-v": v.toPrecision(8), title: v.toPrecision(4) }, s);
  }
  return s;
}

function drawNeuronView() {
  neuronBody.replaceChildren();
  const N = D.neuron;
  if (!N) {
    el("p", { class: "hint" }, neuronBody, "No q and k vectors were given: the neuron view needs queries and keys.");
    return;
  }
  vwBox.disabled = !N.vnorm;
  const l = state.layer;
  const h = state.nHead;
  const i = state.nQuery;
  const q = vector("q", l, h, i);
  const full = fullyMasked(l, h, i);
  const masked = D.masks.length > 0 || !!N.mask;  // a "+ mask" column: blocked keys (−∞) and finite values
  const names = N.terms.map((t) => t.name);
  const sum = ["q·k × scale", ...names, ...(masked ? ["mask"] : [])].join(" + ");
  const head = el("p", { class: "hint" }, neuronBody,
    `${label(D.layers[l])}, head ${h}, query ${i} “${label(D.qtok[i])}”: score_j = ${sum}, ` +
    `scale = ${N.scale.toPrecision(6)}; α = softmax over the keys of the score.` +
    (full ? " Fully masked row: every key is blocked, all weights are 0." : ""));
  head.id = "neuron-caption";
  head.dataset.terms = JSON.stringify(names);

  const rows = [];
  for (let j = 0; j < LK; j++) {
    const k = vector("k", l, h, j);
    const prod = q.map((v, c) => v * k[c]);
    const dot = prod.reduce((a, b) => a + b, 0);
    const terms = N.terms.map((t) => termValue(t, l, h, i, j));
    const isBlocked = blocked(l, h, i, j);
    const mask = isBlocked ? -Infinity : N.mask ? termValue(N.mask, l, h, i, j) : 0;
    const score = dot * N.scale + terms.reduce((a, b) => a + b, 0) + mask;  // −∞ where blocked
    rows.push({ j, k, prod, dot, terms, mask, score, isBlocked });
  }
  const top = Math.max(...rows.map((r) => r.score));
  const ex = rows.map((r) => (Number.isFinite(r.score) ? Math.exp(r.score - top) : 0));
  const total = ex.reduce((a, b) => a + b, 0);
  rows.forEach((r, n) => { r.p = total > 0 ? ex[n] / total : 0; });
  if (state.valueWeighted && N.vnorm) {
    const vw = rows.map((r) => r.p * N.vnorm[l][h][r.j]);
    const s = vw.reduce((a, b) => a + b, 0);
    rows.forEach((r, n) => { r.shown = s > 0 ? vw[n] / s : 0; });
  } else {
    rows.forEach((r) => { r.shown = r.p; });
  }

  const table = el("table", { id: "neuron-table" }, neuronBody);
  const hr = el("tr", {}, table);
  const last = state.valueWeighted && N.vnorm ? "α‖v W_oᵀ‖ (normalised)" : "softmax α";
  const columns = ["key", "k", "q ∘ k (elementwise)", "q · k (sum)", "× scale", ...names.map((n) => `+ ${n}`),
                   ...(masked ? ["+ mask"] : []), "score (the sum)", last];
  for (const t of columns) el("th", { title: t }, hr, label(t));
  const qRow = el("tr", { id: "q-vector" }, table);
  el("td", { class: "tok", title: D.qtok[i] }, qRow, `q: ${label(D.qtok[i])}`);
  strip(el("td", {}, qRow), q, "q");
  el("td", { colspan: columns.length - 2 }, qRow);
  for (const r of rows) {
    const tr = el("tr", { class: r.isBlocked ? "masked" : "", "data-j": r.j }, table);
    el("td", { class: "tok", title: D.ktok[r.j] }, tr, label(D.ktok[r.j]));
    strip(el("td", {}, tr), r.k, "k");
    strip(el("td", {}, tr), r.prod, "prod");
    el("td", { class: "num dot", "data-v": r.dot.toPrecision(8) }, tr, fmt(r.dot, 4));
    el("td", { class: "num scaled", "data-v": (r.dot * N.scale).toPrecision(8) }, tr, fmt(r.dot * N.scale, 4));
    r.terms.forEach((v, n) => {
      el("td", { class: "num term", "data-term": n, "data-v": v.toPrecision(8) }, tr, fmt(v, 4));
    });
    if (masked) {
      el("td", { class: "num mask", "data-v": r.isBlocked ? "-inf" : r.mask.toPrecision(8) }, tr,
         r.isBlocked ? "−∞ (masked)" : fmt(r.mask, 4));
    }
    el("td", { class: "num score", "data-v": Number.isFinite(r.score) ? r.score.toPrecision(8) : "-inf" }, tr,
       r.isBlocked ? "−∞ (masked)" : fmt(r.score, 4));
    const td = el("td", { class: "num weight", "data-v": r.shown.toPrecision(8) }, tr);
    el("span", { class: "bar", style: `width:${Math.round(80 * r.shown)}px;background:${headColor(h)}` }, td);
    el("span", {}, td, ` ${r.shown.toFixed(3)}`);
  }
}

// ------------------------------------------------------------------ switching

function show(view) {
  state.view = view;
  render();
}

function render() {
  for (const [name, section] of Object.entries(views)) section.hidden = name !== state.view;
  tabs.querySelectorAll("button").forEach((b) => b.classList.toggle("active", b.dataset.view === state.view));
  thrLabel.hidden = state.view !== "head";
  if (state.view === "head") drawHeadView();
  if (state.view === "model") drawModelView();
  if (state.view === "neuron") drawNeuronView();
  document.body.dataset.view = state.view;
}

render();
document.body.dataset.ready = "1";
