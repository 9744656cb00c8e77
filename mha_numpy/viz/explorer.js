// mha_numpy attention explorer: head view, model view, neuron view.
// Plain JavaScript and SVG, no libraries, no network. The data (written by mha_numpy/viz/explorer.py) is the
// JSON in the script element with id "explorer-data":
//   qtok, ktok       query and key tokens
//   layers, heads    layer names, number of heads; headNames: each head's label (its index in the model)
//   initLayer, initHeads  the layer and the heads (positions) the head view starts with
//   sentenceB        null, or the index of sentence B's first token (a sentence pair: A→B, B→A, ... filters)
//   grad             null, or {note, g[l][h], step[l][h]}: d(loss)/d(weights) per head, row-major (Lq, Lk),
//                    packed as q and k (two base-64 characters an int, times step; the largest is ±2047)
//   attn[l][h]       attention weights in thousandths, row-major (Lq, Lk)
//   masks, maskIndex distinct masks as '0'/'1' strings (1 = blocked); maskIndex[l][h] = index or -1
//   neuron           null, or {d, scale, q[l][h], qStep[l][h], k[l][h], kStep[l][h], vnorm[l][h] or null,
//                    terms, mask}
//                    q, k: row-major (L, d) ints, two base-64 characters each (int + 2048 = 64·hi + lo);
//                    the value is int * step
//                    terms: the additive score terms besides q·k × scale, [{name, maps, index}]; mask: a float
//                    mask's finite values, {maps, index} or null. maps: distinct row-major (Lq, Lk) floats,
//                    index[l][h] = the map of that layer and head or -1 (all zero)
// A page of several attention sets (an encoder-decoder's encoder, decoder and cross-attention) holds
// {title, sets: [each set's data as above, with its name]}; a select switches between them.
// Text from the data (tokens, title, layer names) goes into the page as text nodes and attribute values only.
"use strict";

const PAGE = JSON.parse(document.getElementById("explorer-data").textContent);
const SETS = PAGE.sets || [PAGE];  // a page of several attentions (encoder, decoder, cross): {title, sets: [data]}
const dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
document.documentElement.dataset.theme = dark ? "dark" : "light";
let redraw = null;  // draws the shown set again (the window's width changed)
let resizing = null;
window.addEventListener("resize", () => {  // the views take the window's width: draw them again for the new one
  clearTimeout(resizing);
  resizing = setTimeout(() => redraw && redraw(), 150);
});

function build(D, current) {  // the page of one attention set D (SETS[current])

  const LQ = D.qtok.length;
  const LK = D.ktok.length;
  const H = D.heads;
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];
  const state = {
    view: "head",
    layer: D.initLayer,
    visible: Array.from({ length: H }, (_, h) => D.initHeads.includes(h)),
    pair: "all",       // sentence pairs: "all", "AA", "BB", "AB", "BA" (queries of the first, keys of the second)
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
  const VIEWS = [["head", "Head view"], ["model", "Model view"], ["neuron", "Neuron view"], ["grad", "Gradient view"]];
  for (const [view, caption] of VIEWS) {
    const b = el("button", { id: `tab-${view}`, "data-view": view }, tabs, caption);
    b.addEventListener("click", () => show(view));
  }
  const themeButton = el("button", { id: "theme", class: "small", title: "switch dark / light" }, tabs);
  function setThemeCaption() {
    themeButton.textContent = document.documentElement.dataset.theme === "dark" ? "☀ light" : "☾ dark";
  }
  setThemeCaption();
  themeButton.addEventListener("click", () => {
    const root = document.documentElement;
    root.dataset.theme = root.dataset.theme === "dark" ? "light" : "dark";
    setThemeCaption();
    grid.replaceChildren();  // the maps are canvases: drawn again in the theme's colours
    gradGrid.replaceChildren();
    render();
  });
  const controls = el("div", { class: "controls" }, root);
  const setLabel = el("label", { id: "set-label" }, controls, "attention ");
  const setSelect = el("select", { id: "set" }, setLabel);
  SETS.forEach((set, k) => el("option", { value: k, title: set.name || "" }, setSelect, label(set.name || "")));
  setSelect.value = String(current);
  setLabel.hidden = SETS.length === 1;
  setSelect.addEventListener("change", () => { root.remove(); tooltip.remove(); build(SETS[+setSelect.value], +setSelect.value); });
  const layerLabel = el("label", { id: "layer-label" }, controls, " layer ");
  const layerSelect = el("select", { id: "layer" }, layerLabel);
  D.layers.forEach((name, l) => el("option", { value: l, title: name }, layerSelect, label(name)));
  layerSelect.value = String(state.layer);
  layerSelect.addEventListener("change", () => { state.layer = +layerSelect.value; gradGrid.replaceChildren(); render(); });
  const pairLabel = el("label", { id: "pair-label" }, controls, " attention ");
  const pairSelect = el("select", { id: "pair" }, pairLabel);
  for (const [v, t] of [["all", "all"], ["AA", "sentence A → A"], ["BB", "sentence B → B"],
                        ["AB", "sentence A → B"], ["BA", "sentence B → A"]]) el("option", { value: v }, pairSelect, t);
  pairSelect.addEventListener("change", () => { state.pair = pairSelect.value; state.focus = null;
                                                state.pinned = false; render(); });
  const thrLabel = el("label", {}, controls, " draw weights ≥ ");
  const thrInput = el("input", { id: "threshold", type: "number", min: "0", max: "1", step: "0.01",
                                value: String(state.threshold) }, thrLabel);
  thrInput.addEventListener("change", () => { state.threshold = Math.max(0, +thrInput.value || 0); render(); });

  const views = {};
  for (const [view] of VIEWS) views[view] = el("section", { id: `${view}-view` }, root);
  const tooltip = el("div", { id: "tooltip", hidden: "" }, document.body);

  function isDark() { return document.documentElement.dataset.theme === "dark"; }

  function weightColor(w) {               // the sequential scale of the weights, 0 -> 1
    if (isDark()) return `rgb(${Math.round(20 + 40 * w)},${Math.round(24 + 150 * w)},${Math.round(32 + 223 * w)})`;
    return `rgb(${Math.round(255 * (1 - w))},${Math.round(255 - 160 * w)},255)`;
  }

  function gradColor(x) {                 // the diverging scale, -1 (blue) .. 0 .. 1 (red)
    const a = Math.min(1, Math.abs(x));
    const base = isDark() ? [24, 24, 28] : [255, 255, 255];
    const end = x >= 0 ? [215, 48, 39] : [49, 104, 220];
    return `rgb(${base.map((b, c) => Math.round(b + (end[c] - b) * a)).join(",")})`;
  }

  function maskedColor(i, j) { return isDark() ? ((i + j) % 2 ? "#3a3a3a" : "#555") : ((i + j) % 2 ? "#d0d0d0" : "#9a9a9a"); }

  function colorScale(parent, id, stops, ticks, caption) {  // a bar of the scale with its ticks, and "masked"
    const box = el("div", { class: "scale", id }, parent);
    el("span", { class: "scale-caption" }, box, caption);
    const wrap = el("span", { class: "scale-bar-wrap" }, box);
    el("span", { class: "scale-bar", style: `background:linear-gradient(to right,${stops.join(",")})` }, wrap);
    const tk = el("span", { class: "scale-ticks" }, wrap);
    for (const t of ticks) el("span", {}, tk, t);
    el("span", { class: "swatch masked-swatch" }, box);
    el("span", {}, box, " masked");
    return box;
  }

  function showTooltip(event, text) {
    tooltip.textContent = text;
    tooltip.hidden = false;
    tooltip.style.left = `${event.pageX + 12}px`;
    tooltip.style.top = `${event.pageY + 12}px`;
  }

  function cellAt(canvas, event, cell) {  // the (query, key) under the mouse on a map of cell px squares
    const r = canvas.getBoundingClientRect();
    const j = Math.floor((event.clientX - r.left) / cell);
    const i = Math.floor((event.clientY - r.top) / cell);
    return i >= 0 && i < LQ && j >= 0 && j < LK ? [i, j] : null;
  }

  // ------------------------------------------------------------------ head view

  const headBar = el("div", { id: "heads", class: "heads" }, views.head);
  el("span", {}, headBar, "heads: ");
  for (let h = 0; h < H; h++) {
    const label = el("label", { class: "head-toggle", style: `border-color:${headColor(h)}`,
                                title: "click: on / off; double-click: only this head" }, headBar);
    const box = el("input", { type: "checkbox", "data-head": h }, label);
    box.checked = state.visible[h];
    box.addEventListener("change", () => { state.visible[h] = box.checked; render(); });
    label.addEventListener("dblclick", (e) => { e.preventDefault(); setHeads((k) => k === h); render(); });
    el("span", { class: "swatch", style: `background:${headColor(h)}` }, label);
    el("span", {}, label, ` ${D.headNames[h]}`);
  }
  for (const [id, on] of [["all-heads", true], ["no-heads", false]]) {
    const b = el("button", { id, class: "small" }, headBar, on ? "all" : "none");
    b.addEventListener("click", () => { setHeads(() => on); render(); });
  }
  el("p", { class: "hint" }, views.head,
     "Lines go from each query (left) to the keys it attends to (right); opacity = weight, one colour per head. " +
     "Hover a token to see only its lines and, beside the tokens across, one block per head whose opacity is " +
     "that weight; click to pin it. Double-click a head to see it alone. Grey struck-through keys are masked; " +
     "⊘ marks a fully masked query (zero weights).");
  const ROW = 22;
  const svg = el("svg", { id: "head-svg", width: 560, height: Math.max(LQ, LK) * ROW + 40 }, views.head);
  const layout = { qx: 150, kx: 410, qw: 40, kw: 40 };  // the right edge of the query labels, the left edge of the keys

  function setHeads(pick) {
    for (let h = 0; h < H; h++) state.visible[h] = pick(h);
    headBar.querySelectorAll("input[data-head]").forEach((box) => { box.checked = state.visible[+box.dataset.head]; });
  }

  function ranges() {                     // [start, end) of the queries and of the keys the head view shows
    const b = D.sentenceB;
    const part = (c) => (c === "A" ? [0, b] : [b, LQ]);
    if (b === null || state.pair === "all") return { q: [0, LQ], k: [0, LK] };
    return { q: part(state.pair[0]), k: part(state.pair[1]) };
  }

  function rowY(index, start) { return 30 + (index - start) * ROW; }

  function tokenText(side, index, start) {
    const tok = (side === "q" ? D.qtok : D.ktok)[index];
    const g = el("g", { class: `tokg ${side}`, "data-index": index }, svg);
    el("rect", { class: "focus-bg", y: rowY(index, start) - ROW / 2, height: ROW }, g);
    const blocks = el("g", { class: "blocks" }, g);
    for (const h of visibleHeads()) {
      el("rect", { class: "block", "data-h": h, y: rowY(index, start) - ROW / 2 + 1, height: ROW - 2,
                   fill: headColor(h), "fill-opacity": 0 }, blocks);
    }
    const t = el("text", { y: rowY(index, start), "text-anchor": side === "q" ? "end" : "start",
                          class: `tok ${side}`, "data-index": index }, g);
    el("title", {}, t, tok);  // the tooltip: the whole token
    el("tspan", { class: "label" }, t, label(tok));
    g.addEventListener("mouseenter", () => { if (!state.pinned) { state.focus = { side, index }; drawLines(); } });
    g.addEventListener("mouseleave", () => { if (!state.pinned) { state.focus = null; drawLines(); } });
    g.addEventListener("click", () => {
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
    const r = ranges();
    const qAxis = el("text", { y: 10, "text-anchor": "end", class: "axis" }, svg, "query");
    const kAxis = el("text", { y: 10, class: "axis" }, svg, "key");
    el("g", { id: "lines" }, svg);
    const qs = [], ks = [];
    for (let i = r.q[0]; i < r.q[1]; i++) qs.push(tokenText("q", i, r.q[0]));
    for (let j = r.k[0]; j < r.k[1]; j++) ks.push(tokenText("k", j, r.k[0]));
    layout.qw = widest(qs, "⊘ ") + 8;  // room for the fully-masked mark
    layout.kw = widest(ks, "") + 8;
    layout.qx = 6 + layout.qw;
    const room = (document.documentElement.clientWidth || 1000) - 60 - layout.qw - layout.kw;
    layout.kx = layout.qx + Math.max(200, Math.min(600, room * 0.8));  // the lines get the window's width
    svg.setAttribute("width", layout.kx + layout.kw + 6);
    svg.setAttribute("height", Math.max(r.q[1] - r.q[0], r.k[1] - r.k[0]) * ROW + 30);
    for (const t of [qAxis, ...qs]) t.setAttribute("x", layout.qx - 4);
    for (const t of [kAxis, ...ks]) t.setAttribute("x", layout.kx + 4);
    const heads = visibleHeads();
    svg.querySelectorAll("g.tokg").forEach((g) => {
      const left = g.classList.contains("q") ? layout.qx - layout.qw : layout.kx;
      const width = g.classList.contains("q") ? layout.qw : layout.kw;
      const bg = g.querySelector("rect.focus-bg");
      bg.setAttribute("x", left);
      bg.setAttribute("width", width);
      g.querySelectorAll("rect.block").forEach((b, n) => {
        b.setAttribute("x", left + (n * width) / heads.length);
        b.setAttribute("width", width / heads.length);
      });
    });
    drawLines();
  }

  function drawLines() {
    const g = svg.querySelector("#lines");
    g.replaceChildren();
    const l = state.layer;
    const heads = visibleHeads();
    const f = state.focus;
    const r = ranges();
    const minInt = Math.round(state.threshold * 1000);
    let count = 0;
    const spread = Math.min(1.5, 12 / Math.max(1, heads.length));  // px between heads, so that lines do not hide
    heads.forEach((h, rank) => {
      const off = (rank - (heads.length - 1) / 2) * spread;
      for (let i = r.q[0]; i < r.q[1]; i++) {
        if (f && f.side === "q" && f.index !== i) continue;
        for (let j = r.k[0]; j < r.k[1]; j++) {
          if (f && f.side === "k" && f.index !== j) continue;
          const w = D.attn[l][h][i * LK + j];
          if (w === 0 || w < minInt) continue;
          el("line", { x1: layout.qx + 2, y1: rowY(i, r.q[0]) + off, x2: layout.kx - 2, y2: rowY(j, r.k[0]) + off,
                       stroke: headColor(h),
                       "stroke-opacity": Math.min(1, 0.06 + w / 1000).toFixed(3), "stroke-width": 2, class: "attn",
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
    // a query is fully masked when every visible head blocks all its keys. The blocks beside the tokens across
    // from the focused one show each visible head's weight (bertviz's colour boxes).
    const l = state.layer;
    const f = state.focus;
    const r = ranges();
    const queries = [];
    for (let i = r.q[0]; i < r.q[1]; i++) if (!(f && f.side === "q") || f.index === i) queries.push(i);
    svg.querySelectorAll("g.tokg").forEach((g) => {
      const side = g.classList.contains("q") ? "q" : "k";
      const n = +g.dataset.index;
      const t = g.querySelector("text");
      const focused = !!f && f.side === side && f.index === n;
      t.classList.toggle("focus", focused);
      g.classList.toggle("focus", focused);
      g.querySelectorAll("rect.block").forEach((b) => {
        const h = +b.dataset.h;
        const w = !f || f.side === side ? 0 : side === "k" ? weight(l, h, f.index, n) : weight(l, h, n, f.index);
        b.setAttribute("fill-opacity", w.toFixed(3));
        b.dataset.w = w.toFixed(3);
      });
      if (side === "k") {
        t.classList.toggle("masked", heads.length > 0 && heads.every((h) => queries.every((i) => blocked(l, h, i, n))));
      } else {
        const full = heads.length > 0 && heads.every((h) => fullyMasked(l, h, n));
        t.classList.toggle("fully-masked", full);
        t.querySelector("tspan").textContent = (full ? "⊘ " : "") + label(D.qtok[n]);
      }
    });
  }

  // ------------------------------------------------------------------ model view

  function mapCell(perRow, most) {        // px of a cell so that perRow maps of max(Lq, Lk) cells fit the window
    const width = (document.documentElement.clientWidth || 1000) - 110;
    return Math.max(1, Math.min(most, Math.floor((width / perRow - 8) / Math.max(LQ, LK))));
  }

  el("p", { class: "hint" }, views.model,
     "Every layer (rows) and head (columns); rows of a map are queries, columns keys; hatched grey = masked. " +
     "Hover a map for the tokens and the weight under the mouse; click it to open it in the head view.");
  colorScale(views.model, "model-scale", [weightColor(0), weightColor(0.5), weightColor(1)], ["0", "0.5", "1"],
             "attention weight ");
  const grid = el("div", { id: "model-grid" }, views.model);

  function drawMap(canvas, cell, color) {  // color(i, j): a cell's fill
    const ctx = canvas.getContext("2d");
    for (let i = 0; i < LQ; i++) {
      for (let j = 0; j < LK; j++) {
        ctx.fillStyle = color(i, j);
        ctx.fillRect(j * cell, i * cell, cell, cell);
      }
    }
  }

  function pairText(l, h, i, j) {          // the tooltip of a cell: layer, head, the two tokens
    return `${label(D.layers[l])}, head ${D.headNames[h]}: query ${i} “${label(D.qtok[i])}” → key ${j} ` +
           `“${label(D.ktok[j])}”`;
  }

  function drawModelView() {
    if (grid.childElementCount) return;  // drawn once per theme: the maps do not change
    const scale = document.getElementById("model-scale");
    scale.querySelector(".scale-bar").style.background =
      `linear-gradient(to right,${weightColor(0)},${weightColor(0.5)},${weightColor(1)})`;
    const cell = mapCell(H, 12);
    const table = el("table", {}, grid);
    const head = el("tr", {}, table);
    el("th", {}, head);
    for (let h = 0; h < H; h++) el("th", { style: `color:${headColor(h)}` }, head, `head ${D.headNames[h]}`);
    D.layers.forEach((name, l) => {
      const row = el("tr", {}, table);
      el("th", { title: name }, row, label(name));
      for (let h = 0; h < H; h++) {
        const td = el("td", {}, row);
        const c = el("canvas", { class: "thumb", width: LK * cell, height: LQ * cell, "data-layer": l, "data-head": h,
                                 title: `${name}, head ${D.headNames[h]}: click to open in the head view` }, td);
        drawMap(c, cell, (i, j) => (blocked(l, h, i, j) ? maskedColor(i, j) : weightColor(weight(l, h, i, j))));
        c.addEventListener("mousemove", (e) => {
          const at = cellAt(c, e, cell);
          if (!at) { tooltip.hidden = true; return; }
          const [i, j] = at;
          showTooltip(e, `${pairText(l, h, i, j)}: ` + (blocked(l, h, i, j) ? "masked" : `α = ${weight(l, h, i, j)}`));
        });
        c.addEventListener("mouseleave", () => { tooltip.hidden = true; });
        c.addEventListener("click", () => {
          state.layer = l;
          layerSelect.value = String(l);
          setHeads((k) => k === h);
          state.focus = null;
          state.pinned = false;
          tooltip.hidden = true;
          show("head");
        });
      }
    });
  }

  // ------------------------------------------------------------------ gradient view

  el("p", { class: "hint", id: "grad-note" }, views.grad,
     D.grad ? D.grad.note : "No gradient was given (weight_grads=): explore_attention and explore_bert compute one.");
  const gradScale = D.grad ? colorScale(views.grad, "grad-scale", [gradColor(-1), gradColor(0), gradColor(1)],
                                        ["−max", "0", "+max"], "dL/dα ") : null;
  const gradGrid = el("div", { id: "grad-grid" }, views.grad);

  function gradValue(l, h, i, j) {      // packed as q and k: two base-64 characters, times the head's step
    const p = D.grad.g[l][h];
    const at = 2 * (i * LK + j);
    return (64 * B64.indexOf(p[at]) + B64.indexOf(p[at + 1]) - 2048) * D.grad.step[l][h];
  }

  function drawGradView() {
    if (!D.grad || gradGrid.childElementCount) return;
    gradScale.querySelector(".scale-bar").style.background =
      `linear-gradient(to right,${gradColor(-1)},${gradColor(0)},${gradColor(1)})`;
    const l = state.layer;
    const cell = mapCell(Math.min(H, 6), 28);
    for (let h = 0; h < H; h++) {
      const fig = el("figure", { class: "grad-map" }, gradGrid);
      el("figcaption", { style: `color:${headColor(h)}` }, fig,
         `head ${D.headNames[h]}: max |dL/dα| = ${(2047 * D.grad.step[l][h]).toPrecision(3)}`);
      const c = el("canvas", { class: "thumb grad", width: LK * cell, height: LQ * cell, "data-layer": l,
                               "data-head": h }, fig);
      const top = 2047 * D.grad.step[l][h];  // the largest |value| (its int is ±2047)
      drawMap(c, cell, (i, j) => (blocked(l, h, i, j) ? maskedColor(i, j) : gradColor(gradValue(l, h, i, j) / top)));
      c.addEventListener("mousemove", (e) => {
        const at = cellAt(c, e, cell);
        if (!at) { tooltip.hidden = true; return; }
        const [i, j] = at;
        showTooltip(e, `${pairText(l, h, i, j)}: ` + (blocked(l, h, i, j) ? "masked (α fixed at 0)" :
          `dL/dα = ${gradValue(l, h, i, j).toPrecision(3)}, α = ${weight(l, h, i, j)}`));
      });
      c.addEventListener("mouseleave", () => { tooltip.hidden = true; });
    }
  }

  // ------------------------------------------------------------------ neuron view

  const neuronBar = el("div", { class: "controls" }, views.neuron);
  const nHeadLabel = el("label", {}, neuronBar, "head ");
  const nHeadSelect = el("select", { id: "neuron-head" }, nHeadLabel);
  for (let h = 0; h < H; h++) el("option", { value: h }, nHeadSelect, D.headNames[h]);
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
      `${label(D.layers[l])}, head ${D.headNames[h]}, query ${i} “${label(D.qtok[i])}”: score_j = ${sum}, ` +
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
    tabs.querySelectorAll("button[data-view]").forEach((b) => b.classList.toggle("active", b.dataset.view === state.view));
    thrLabel.hidden = state.view !== "head";
    pairLabel.hidden = state.view !== "head" || D.sentenceB === null;  // only a sentence pair has parts
    layerLabel.hidden = state.view === "model" || D.layers.length === 1;  // the model view has every layer
    setLabel.hidden = SETS.length === 1;
    controls.hidden = [setLabel, layerLabel, pairLabel, thrLabel].every((x) => x.hidden);
    if (state.view === "head") drawHeadView();
    if (state.view === "model") drawModelView();
    if (state.view === "neuron") drawNeuronView();
    if (state.view === "grad") drawGradView();
    document.body.dataset.view = state.view;
  }


  redraw = () => { grid.replaceChildren(); gradGrid.replaceChildren(); render(); };
  render();
}

build(SETS[0], 0);
document.body.dataset.ready = "1";
