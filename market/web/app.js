// The live order book: fetches /v1/overview and redraws whenever /v1/stream says something
// changed. No framework, no build step; charts are drawn on <canvas>.
"use strict";

const state = { data: null, selected: null, fetching: false, again: false };

const el = (id) => document.getElementById(id);
const fmt = (n) => Number(n).toLocaleString("en-US");
// Token amounts are uint256 decimal strings: exact with BigInt.
const amount = (n) => BigInt(n).toLocaleString("en-US");
const short = (addr) => (addr ? addr.slice(0, 6) + "…" + addr.slice(-4) : "");
const ago = (t) => {
  const s = Math.max(0, Math.round(Date.now() / 1000 - t));
  return s < 60 ? s + "s ago" : s < 3600 ? Math.round(s / 60) + "m ago" : Math.round(s / 3600) + "h ago";
};

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function row(cells, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const c of cells) tr.appendChild(c);
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

async function refresh() {
  if (state.fetching) { state.again = true; return; }
  state.fetching = true;
  try {
    const response = await fetch("/v1/overview", { cache: "no-store" });
    if (response.ok) {
      state.data = await response.json();
      render();
    }
  } catch (err) {
    // The stream's reconnect will trigger another refresh.
  } finally {
    state.fetching = false;
    if (state.again) { state.again = false; refresh(); }
  }
}

function render() {
  const d = state.data;
  if (!d.classes.includes(state.selected)) state.selected = d.classes[0] || null;
  const nav = el("classes");
  nav.replaceChildren(...d.classes.map((name) => {
    const b = document.createElement("button");
    b.textContent = name;
    b.dataset.class = name;
    if (name === state.selected) b.className = "active";
    b.addEventListener("click", () => { state.selected = name; render(); });
    return b;
  }));
  renderBook(d);
  renderFills(d);
  renderProviders(d);
  renderDeals(d);
  drawDepth(d.books[state.selected]);
  drawHistory(d.history[state.selected] || []);
}

function renderBook(d) {
  const book = d.books[state.selected] || { bids: [], asks: [], best_bid: null, best_ask: null };
  el("book-title").textContent = state.selected ? "— " + state.selected : "(no orders yet)";
  const maxQ = Math.max(1, ...book.bids.map((l) => l.quantity), ...book.asks.map((l) => l.quantity));
  const bar = (q, color, dir) =>
    `linear-gradient(to ${dir}, ${color} ${(100 * q) / maxQ}%, transparent ${(100 * q) / maxQ}%)`;
  fill(el("bids"), book.bids.map((l) => {
    const tr = row([cell(fmt(l.orders)), cell(fmt(l.quantity)), cell(fmt(l.price), "price")], "bid level");
    tr.style.backgroundImage = bar(l.quantity, "rgba(46,204,113,0.15)", "left");
    return tr;
  }));
  fill(el("asks"), book.asks.map((l) => {
    const tr = row([cell(fmt(l.price), "price"), cell(fmt(l.quantity)), cell(fmt(l.orders))], "ask level");
    tr.style.backgroundImage = bar(l.quantity, "rgba(231,76,60,0.15)", "right");
    return tr;
  }));
  const spread = book.best_bid != null && book.best_ask != null ? book.best_ask - book.best_bid : null;
  el("spread").textContent = `best bid ${book.best_bid ?? "—"} · best ask ${book.best_ask ?? "—"}` +
    (spread != null ? ` · spread ${spread}` : "");
}

function renderFills(d) {
  fill(el("fills"), d.fills.map((f) => row([
    cell(new Date(f.time * 1000).toLocaleTimeString()), cell(f.device_class, "l"),
    cell(fmt(f.price), "price"), cell(fmt(f.quantity)), cell(f.aggressor, "l"),
  ], f.aggressor)));
}

function renderProviders(d) {
  fill(el("providers"), d.providers.map((p) => row([
    cell(short(p.address) + (p.online ? "" : " (offline)"), "l"), cell(p.device_class, "l"),
    cell(p.device_kind, "l"), cell(fmt(p.device_count)), cell(fmt(p.price)),
    cell(Number(p.throughput).toFixed(2)), cell((100 * p.reliability).toFixed(1) + "%"),
    cell(`${amount(p.paid)} (${p.clients}) / ${amount(p.refunded)} + ${amount(p.penalties)}`),
    cell(ago(p.last_seen)),
  ])));
}

function txCell(deal) {
  const td = document.createElement("td");
  td.className = "l";
  for (const [label, hash] of [["open", deal.opened_tx], ["last", deal.last_tx], ["close", deal.closed_tx]]) {
    if (!hash || (label === "last" && (hash === deal.opened_tx || hash === deal.closed_tx))) continue;
    const code = document.createElement("code");
    code.title = hash;
    code.textContent = `${label} ${hash.slice(0, 10)}… `;
    td.appendChild(code);
  }
  return td;
}

function renderDeals(d) {
  fill(el("deals"), d.deals.map((x) => {
    const status = cell(x.status, "l");
    status.innerHTML = "";
    const span = document.createElement("span");
    span.className = "status " + x.status;
    span.textContent = x.status;
    status.appendChild(span);
    return row([
      cell(x.deal_id, "l"), cell(short(x.client), "l"), cell(short(x.provider), "l"),
      cell(`${fmt(x.price)} × ${fmt(x.quantity)}`), status, cell(x.chain_deal_id ?? "—"),
      cell(fmt(x.tasks_paid)), cell(amount(x.paid)), cell(fmt(x.refunds)), txCell(x),
    ]);
  }));
}

function setupCanvas(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, w, h };
}

function axisLabel(ctx, text, x, y, align) {
  ctx.fillStyle = "#7d8a99";
  ctx.textAlign = align || "left";
  ctx.fillText(text, x, y);
}

function drawDepth(book) {
  const { ctx, w, h } = setupCanvas(el("depth"));
  if (!book || (!book.bids.length && !book.asks.length)) { axisLabel(ctx, "no resting orders", 10, 20); return; }
  const cum = (levels) => { let t = 0; return levels.map((l) => [l.price, (t += l.quantity)]); };
  const bids = cum(book.bids), asks = cum(book.asks);
  const prices = [...bids, ...asks].map((p) => p[0]);
  let lo = Math.min(...prices), hi = Math.max(...prices);
  if (lo === hi) { lo -= 1; hi += 1; }
  const maxQ = Math.max(1, ...bids.map((p) => p[1]), ...asks.map((p) => p[1]));
  const pad = 30, x = (p) => pad + ((p - lo) / (hi - lo)) * (w - 2 * pad), y = (q) => h - pad - (q / maxQ) * (h - 2 * pad);
  const area = (points, color, fillColor) => {
    if (!points.length) return;
    ctx.beginPath();
    ctx.moveTo(x(points[0][0]), y(0));
    let prevQ = 0;
    for (const [p, q] of points) { ctx.lineTo(x(p), y(prevQ)); ctx.lineTo(x(p), y(q)); prevQ = q; }
    ctx.lineTo(x(points[points.length - 1][0]), y(0));
    ctx.closePath();
    ctx.fillStyle = fillColor; ctx.fill();
    ctx.strokeStyle = color; ctx.stroke();
  };
  area(bids, "#2ecc71", "rgba(46,204,113,0.2)");
  area(asks, "#e74c3c", "rgba(231,76,60,0.2)");
  axisLabel(ctx, fmt(lo), pad, h - 10, "left");
  axisLabel(ctx, fmt(hi), w - pad, h - 10, "right");
  axisLabel(ctx, "cum. qty " + fmt(maxQ), pad, 14, "left");
}

function drawHistory(bars) {
  const { ctx, w, h } = setupCanvas(el("history"));
  if (!bars.length) { axisLabel(ctx, "no trades yet", 10, 20); return; }
  const lo = Math.min(...bars.map((b) => b[3])), hi = Math.max(...bars.map((b) => b[2]));
  const span = hi - lo || 1, maxV = Math.max(1, ...bars.map((b) => b[5]));
  const pad = 30, step = (w - 2 * pad) / Math.max(1, bars.length);
  const y = (p) => pad + (1 - (p - lo) / span) * (h - 3 * pad);
  bars.forEach((b, i) => {
    const cx = pad + step * (i + 0.5);
    ctx.fillStyle = "rgba(74,163,255,0.25)";
    const vh = (b[5] / maxV) * pad;
    const bw = Math.min(step * 0.7, 16);
    ctx.fillRect(cx - bw / 2, h - pad - vh + pad * 0.8, bw, vh);
    ctx.strokeStyle = "#7d8a99";
    ctx.beginPath(); ctx.moveTo(cx, y(b[2])); ctx.lineTo(cx, y(b[3])); ctx.stroke();
  });
  ctx.strokeStyle = "#4aa3ff";
  ctx.beginPath();
  bars.forEach((b, i) => { const cx = pad + step * (i + 0.5); i ? ctx.lineTo(cx, y(b[4])) : ctx.moveTo(cx, y(b[4])); });
  ctx.stroke();
  axisLabel(ctx, fmt(hi), 2, pad, "left");
  axisLabel(ctx, fmt(lo), 2, h - 2 * pad, "left");
  axisLabel(ctx, new Date(bars[0][0] * 1000).toLocaleTimeString(), pad, h - 4, "left");
  axisLabel(ctx, new Date(bars[bars.length - 1][0] * 1000).toLocaleTimeString(), w - pad, h - 4, "right");
}

function connect() {
  const live = el("live");
  const source = new EventSource("/v1/stream");
  source.addEventListener("update", () => refresh());
  source.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
}

window.addEventListener("resize", () => { if (state.data) render(); });
refresh();
connect();
