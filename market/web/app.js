// The market page: offers a buyer can take, the order book as a buyer filters it, the tape.
// Fetches /v1/overview, /v1/book and /v1/offers, and again whenever /v1/stream says something
// changed. No framework, no build step; charts in charts.js. Amounts arrive in token base
// units and are shown in tokens.
"use strict";

const state = {
  data: null, selected: null, book: null, offers: [], sort: "price", take: null,
  fetching: false, again: false,
};
const SORT_DESCENDING_FIRST = new Set(["reliability", "memory", "capacity", "quantity"]);
const GIB = 2 ** 30;

const el = (id) => document.getElementById(id);
const fmt = (n) => Number(n).toLocaleString("en-US");
const decimals = () => (state.data ? state.data.token_decimals : 6);
// Base units (integer or decimal string) to tokens, exactly: "1603" -> "0.001603".
function tokens(units) {
  const d = decimals();
  const v = BigInt(units), sign = v < 0n ? "-" : "", a = v < 0n ? -v : v;
  const base = 10n ** BigInt(d);
  const whole = (a / base).toLocaleString("en-US");
  const frac = (a % base).toString().padStart(d, "0").replace(/0+$/, "");
  return sign + whole + (frac ? "." + frac : "");
}
const tokenNumber = (units) => Number(units) / 10 ** decimals();
// Tokens typed by a person to base units (a string), or null if not a number of tokens.
function toUnits(text) {
  const m = /^\s*(\d*)(?:\.(\d*))?\s*$/.exec(text || "");
  if (!m || (!m[1] && !m[2])) return null;
  const d = decimals();
  const frac = (m[2] || "").slice(0, d).padEnd(d, "0");
  return (BigInt(m[1] || "0") * 10n ** BigInt(d) + BigInt(frac || "0")).toString();
}
const bytes = (n) => {
  const v = Number(n);
  if (v >= GIB) return +(v / GIB).toPrecision(4) + " GiB";
  if (v >= 2 ** 20) return +(v / 2 ** 20).toPrecision(4) + " MiB";
  return fmt(v) + " B";
};
const short = (addr) => (addr ? addr.slice(0, 6) + "…" + addr.slice(-4) : "");
const pct = (r) => (r == null ? "—" : (100 * r).toFixed(1) + "%");
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

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": " + response.status);
  return response.json();
}

function bookQuery() {
  const form = el("book-filters"), q = new URLSearchParams({ levels: "30" });
  for (const name of ["plan", "slo_ms", "memory"]) if (form.elements[name].value) q.set(name, form.elements[name].value);
  return q;
}

function offerQuery() {
  const f = el("offer-filters").elements, q = new URLSearchParams({ sort: state.sort, limit: "200" });
  if (state.selected) q.set("device_class", state.selected);
  if (f.plan.value) q.set("plan", f.plan.value);
  if (/^\d+$/.test(f.max_slo_ms.value)) q.set("max_slo_ms", f.max_slo_ms.value);
  const gib = parseFloat(f.min_memory_gib.value);
  if (gib >= 0) q.set("min_memory", String(Math.ceil(gib * GIB)));
  const price = toUnits(f.max_price_tokens.value);
  if (price !== null) q.set("max_price", price);
  const rel = parseFloat(f.min_reliability_pct.value);
  if (rel >= 0 && rel <= 100) q.set("min_reliability", String(rel / 100));
  if (f.online.checked) q.set("online", "true");
  return q;
}

async function refresh() {
  if (state.fetching) { state.again = true; return; }
  state.fetching = true;
  try {
    state.data = await getJson("/v1/overview");
    if (!state.data.classes.includes(state.selected)) state.selected = state.data.classes[0] || null;
    const [book, offers] = await Promise.all([
      state.selected ? getJson(`/v1/book/${state.selected}?${bookQuery()}`) : null,
      getJson(`/v1/offers?${offerQuery()}`),
    ]);
    state.book = book;
    state.offers = offers;
    render();
  } catch (err) {
    // The stream's reconnect or the next change triggers another refresh.
  } finally {
    state.fetching = false;
    if (state.again) { state.again = false; refresh(); }
  }
}

function render() {
  const d = state.data;
  el("classes").replaceChildren(...d.classes.map((name) => {
    const b = document.createElement("button");
    const s = d.stats[name] || {};
    b.dataset.class = name;
    b.textContent = name;
    const note = document.createElement("small");
    note.textContent = s.last_price != null ? ` ${tokens(s.last_price)} ${change(s)}` : "";
    b.appendChild(note);
    if (name === state.selected) b.className = "active";
    b.addEventListener("click", () => { state.selected = name; clearBookFilters(); refresh(); });
    return b;
  }));
  renderStats(d.stats[state.selected]);
  renderOffers();
  renderBook();
  renderFills(d);
  renderProviders(d);
  renderDeals(d);
  Charts.depth(el("depth"), state.book, tokenNumber);
  Charts.history(el("history"), d.history[state.selected] || [], tokenNumber);
}

function change(s) {
  if (s.change_24h == null) return "";
  const sign = s.change_24h > 0 ? "+" : "";
  return `${sign}${s.change_24h_pct != null ? s.change_24h_pct.toFixed(2) + "%" : tokens(s.change_24h)}`;
}

function renderStats(s) {
  el("stats-title").textContent = state.selected ? "— " + state.selected : "(no orders yet)";
  const has = s && s.last_price != null;
  el("stat-last").textContent = has ? `${tokens(s.last_price)} tokens` : "no trades yet";
  const ch = el("stat-change");
  ch.textContent = has && s.change_24h != null ? `${s.change_24h >= 0 ? "+" : "−"}${tokens(Math.abs(s.change_24h))} (${change(s)})` : "—";
  ch.className = has && s.change_24h > 0 ? "up" : has && s.change_24h < 0 ? "down" : "";
  el("stat-range").textContent = has && s.high_24h != null ? `${tokens(s.high_24h)} / ${tokens(s.low_24h)}` : "—";
  el("stat-volume").textContent = s ? `${fmt(s.volume_24h)} units in ${fmt(s.trades_24h)} trades` : "—";
  const b = state.book;
  el("stat-quote").textContent = b ? `${b.best_bid != null ? tokens(b.best_bid) : "—"} / ${b.best_ask != null ? tokens(b.best_ask) : "—"}` : "—";
}

function setOptions(select, values, label) {
  const keep = select.value;
  const options = [new Option("any", "")];
  for (const v of values) options.push(new Option(label(v), String(v)));
  if (keep && !values.map(String).includes(keep)) options.push(new Option(keep, keep));
  select.replaceChildren(...options);
  select.value = keep;
}

function clearBookFilters() {
  for (const s of el("book-filters").elements) s.value = "";
}

function renderBook() {
  const book = state.book || { bids: [], asks: [], choices: { plans: [], slo_ms: [], memory: [] } };
  el("book-title").textContent = state.selected ? "— " + state.selected : "";
  const f = el("book-filters").elements;
  setOptions(f.plan, book.choices.plans, (v) => v);
  setOptions(f.slo_ms, book.choices.slo_ms, (v) => `${fmt(v)} ms`);
  setOptions(f.memory, book.choices.memory, bytes);
  const maxQ = Math.max(1, ...book.bids.map((l) => l.quantity), ...book.asks.map((l) => l.quantity));
  const level = (l, side) => {
    const tr = row([cell(tokens(l.price), "price"), cell(fmt(l.quantity)), cell(fmt(l.orders)),
      cell(`${fmt(l.slo_ms)} ms`), cell(bytes(l.memory)), cell(l.plan, "l")], side + " level");
    const share = (100 * l.quantity) / maxQ;
    const color = side === "bid" ? "rgba(46,204,113,0.15)" : "rgba(231,76,60,0.15)";
    tr.style.backgroundImage = `linear-gradient(to left, ${color} ${share}%, transparent ${share}%)`;
    return tr;
  };
  el("bids").replaceChildren(...book.bids.map((l) => level(l, "bid")));
  el("asks").replaceChildren(...book.asks.map((l) => level(l, "ask")));
  const bb = book.best_bid, ba = book.best_ask;
  let text = `best bid ${bb != null ? tokens(bb) : "—"} · best ask ${ba != null ? tokens(ba) : "—"}`;
  if (book.spread != null) text += ` · spread ${tokens(book.spread)}`;
  else if (bb != null && ba != null && !book.tradable) text += " · mixed terms: pick plan, SLO and memory to see what trades";
  el("spread").textContent = text;
}

function renderOffers() {
  const f = el("offer-filters").elements;
  const plans = state.book ? state.book.choices.plans : [];
  setOptions(f.plan, plans, (v) => v);
  for (const b of document.querySelectorAll("#offers-card th button")) {
    const field = b.dataset.sort, on = state.sort.replace("-", "") === field;
    b.parentElement.setAttribute("aria-sort", on ? (state.sort.startsWith("-") ? "descending" : "ascending") : "none");
    b.className = on ? "sorted" : "";
  }
  el("offers").replaceChildren(...state.offers.map((o) => {
    const take = document.createElement("button");
    take.type = "button";
    take.textContent = "Take";
    take.className = "take-button";
    take.addEventListener("click", () => { state.take = o; showTake(); });
    const who = cell(short(o.provider) + (o.online ? "" : " (offline)"), "l");
    who.title = o.provider + (o.device_kind ? " — " + o.device_kind : "");
    if (o.device_kind) {
      const kind = document.createElement("small");
      kind.textContent = " " + o.device_kind;
      who.appendChild(kind);
    }
    const last = document.createElement("td");
    last.appendChild(take);
    return row([last, who, cell(pct(o.reliability)), cell(`${fmt(o.slo_ms)} ms`), cell(bytes(o.memory)),
      cell(o.plan, "l"), cell(tokens(o.price), "price"), cell(fmt(o.quantity)), cell(fmt(o.capacity))], "offer");
  }));
}

function showTake() {
  const o = state.take;
  el("take").hidden = !o;
  if (!o) return;
  el("command").textContent =
    `export TPUMARKET_MARKET_URL=${location.origin} TPUMARKET_ESCROW=${state.data.escrow}\n${o.command}`;
  el("take").scrollIntoView({ block: "nearest" });
}

function renderFills(d) {
  el("fills").replaceChildren(...d.fills.map((f) => row([
    cell(new Date(f.time * 1000).toLocaleTimeString(), "l"), cell(f.device_class, "l"),
    cell(tokens(f.price), "price"), cell(fmt(f.quantity)), cell(f.aggressor, "l"),
  ], f.aggressor)));
}

function renderProviders(d) {
  el("providers").replaceChildren(...d.providers.map((p) => row([
    cell(short(p.address) + (p.online ? "" : " (offline)"), "l"), cell(p.device_class, "l"),
    cell(p.device_kind, "l"), cell(fmt(p.device_count)), cell(tokens(p.price)),
    cell(Number(p.throughput).toFixed(2)), cell(pct(p.reliability)),
    cell(`${tokens(p.paid)} (${p.clients}) / ${tokens(p.refunded)} + ${tokens(p.penalties)}`),
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
  el("deals").replaceChildren(...d.deals.map((x) => {
    const status = document.createElement("td");
    status.className = "l";
    const span = document.createElement("span");
    span.className = "status " + x.status;
    span.textContent = x.status;
    status.appendChild(span);
    return row([
      cell(x.deal_id, "l"), cell(short(x.client), "l"), cell(short(x.provider), "l"),
      cell(`${tokens(x.price)} × ${fmt(x.quantity)}`), status, cell(x.chain_deal_id ?? "—"),
      cell(fmt(x.tasks_paid)), cell(tokens(x.paid)), cell(fmt(x.refunds)), txCell(x),
    ]);
  }));
}

function connect() {
  const live = el("live");
  const source = new EventSource("/v1/stream");
  source.addEventListener("update", () => refresh());
  source.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
}

el("book-filters").addEventListener("change", () => refresh());
el("offer-filters").addEventListener("change", () => refresh());
el("offer-filters").addEventListener("submit", (e) => e.preventDefault());
for (const b of document.querySelectorAll("#offers-card th button")) {
  b.addEventListener("click", () => {
    const field = b.dataset.sort;
    const current = state.sort.replace("-", "");
    if (current === field) state.sort = state.sort.startsWith("-") ? field : "-" + field;
    else state.sort = SORT_DESCENDING_FIRST.has(field) ? "-" + field : field;
    refresh();
  });
}
window.addEventListener("resize", () => { if (state.data) render(); });
refresh();
connect();
