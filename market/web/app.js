// The market page: offers a buyer can take, the order book as a buyer filters it, the tape.
// Fetches /v1/overview, /v1/book and /v1/offers, and again whenever /v1/stream says something
// changed. No framework, no build step; charts in charts.js. Amounts arrive in token base
// units and are shown in tokens.
"use strict";

const state = {
  data: null, selected: null, book: null, offers: [], sort: "price", take: null,
  fetching: false, again: false, retry: null, asked: 0, announced: 0, errors: {},
};
const INT64 = 2n ** 63n - 1n;
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
// A number a person typed ("2", "1.5", ".25", "1e-3"), exactly: {digits, exp} for
// digits × 10^exp, or {error} saying why it is not a number the filter can use.
function parseNumber(text) {
  const m = /^\s*([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d{1,3}))?\s*$/.exec(text);
  if (!m || (!m[2] && !m[3])) return { error: "is not a number" };
  const fraction = m[3] || "";
  const digits = BigInt((m[2] || "") + fraction || "0");
  if (m[1] === "-" && digits !== 0n) return { error: "must not be negative" };
  return { digits, exp: (m[4] ? Number(m[4]) : 0) - fraction.length };
}
// digits × 10^exp rounded down (or up) to an integer, as a BigInt.
function scaled(n, shift, up) {
  const exp = n.exp + shift;
  if (exp >= 0) return n.digits * 10n ** BigInt(exp);
  const div = 10n ** BigInt(-exp), q = n.digits / div;
  return up && q * div !== n.digits ? q + 1n : q;
}
const asNumber = (n) => Number(n.digits) * 10 ** n.exp;
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

// Each numeric filter: its query parameter, from the typed number, or an error. A filter with
// an error is not applied, and the page says so next to it.
const NUMBER_FILTERS = {
  max_slo_ms: (n) => ["max_slo_ms", scaled(n, 0, false)],
  min_memory_gib: (n) => ["min_memory", BigInt(Math.ceil(asNumber(n) * GIB))],
  max_price_tokens: (n) => ["max_price", scaled(n, decimals(), false)],
  min_reliability_pct: (n) => {
    const pctValue = asNumber(n);
    if (pctValue > 100) return { error: "must be at most 100" };
    return ["min_reliability", String(pctValue / 100)];
  },
};
const FILTER_LABELS = {
  max_slo_ms: "SLO ≤ ms", min_memory_gib: "memory ≥ GiB", max_price_tokens: "price ≤",
  min_reliability_pct: "reliability ≥ %",
};

function offerQuery(selected) {
  const f = el("offer-filters").elements, q = new URLSearchParams({ sort: state.sort, limit: "200" });
  if (selected) q.set("device_class", selected);
  if (f.plan.value) q.set("plan", f.plan.value);
  const errors = {};
  for (const [name, toParam] of Object.entries(NUMBER_FILTERS)) {
    const text = f[name].value;
    if (!text.trim()) continue;
    const n = parseNumber(text);
    let result = n.error ? n : !Number.isFinite(asNumber(n)) ? { error: "is too large" } : toParam(n);
    if (!result.error && typeof result[1] === "bigint" && result[1] > INT64) result = { error: "is too large" };
    if (result.error) errors[name] = `${FILTER_LABELS[name]}: “${text.trim().slice(0, 24)}” ${result.error}; not applied`;
    else q.set(result[0], String(result[1]));
  }
  if (f.online.checked) q.set("online", "true");
  state.errors = errors;
  return q;
}

function showFilterErrors() {
  const f = el("offer-filters").elements;
  for (const name of Object.keys(NUMBER_FILTERS)) {
    const message = state.errors[name] || "";
    if (el(`${name}-error`).textContent !== message) el(`${name}-error`).textContent = message;
    if (message) f[name].setAttribute("aria-invalid", "true");
    else f[name].removeAttribute("aria-invalid");
  }
}

async function refresh() {
  if (state.fetching) { state.again = true; return; }
  state.fetching = true;
  const asked = state.asked;  // the person's actions this read sees (it reads their filters)
  let read = null;
  try {
    const data = await getJson("/v1/overview");
    const selected = data.classes.includes(state.selected) ? state.selected : data.classes[0] || null;
    const [book, offers] = await Promise.all([
      selected ? getJson(`/v1/book/${selected}?${bookQuery()}`) : null,
      getJson(`/v1/offers?${offerQuery(selected)}`),
    ]);
    read = { data, selected, book, offers };
  } catch (err) {
    // A read failed (the market restarting, a 503, the network): read again shortly rather
    // than wait for the stream's next word, which may not come.
    clearTimeout(state.retry);
    state.retry = setTimeout(refresh, 2000);
  } finally {
    state.fetching = false;
  }
  // Drawing is outside the try: a fault in it is the page's, and shows as one.
  if (read && (read.selected === state.selected || !read.data.classes.includes(state.selected))) {
    Object.assign(state, read);
    render();
    // Said only by a read begun after the action: one under way when it came shows the filters
    // as they were, and the read the action asked for follows it.
    if (asked > state.announced) { state.announced = asked; announce(); }
  } else if (read) {
    state.again = true;  // a tab was pressed while this read was under way: read its class
  }
  if (state.again) { state.again = false; refresh(); }
}

// Children of `container` for `items`, keeping the node of every item whose signature is
// unchanged: a click that lands while the page redraws reaches the node it pressed.
const SIGNATURES = new WeakMap();
function renderKeyed(container, items, signature, build) {
  const old = new Map();
  for (const node of container.children) old.set(SIGNATURES.get(node), node);
  const nodes = items.map((item) => {
    const sig = signature(item);
    let node = old.get(sig);
    if (node) old.delete(sig);
    else { node = build(item); SIGNATURES.set(node, sig); }
    return node;
  });
  const same = nodes.length === container.children.length && nodes.every((n, i) => n === container.children[i]);
  if (!same) container.replaceChildren(...nodes);
}

function render() {
  const d = state.data;
  renderTabs(d);
  renderStats(d.stats[state.selected]);
  renderOffers();
  renderBook();
  renderFills(d);
  renderProviders(d);
  renderDeals(d);
  Charts.depth(el("depth"), state.book, tokenNumber);
  Charts.history(el("history"), d.history[state.selected] || [], tokenNumber);
}

// The class tabs, each kept while the classes are the same and changed in place: a press that
// lands while the page redraws reaches the tab it pressed.
function renderTabs(d) {
  const box = el("classes");
  if ([...box.children].map((b) => b.dataset.class).join("\n") !== d.classes.join("\n")) {
    box.replaceChildren(...d.classes.map((name) => {
      const b = document.createElement("button");
      b.dataset.class = name;
      b.append(name, document.createElement("small"));
      b.addEventListener("click", () => { state.selected = name; clearBookFilters(); userRefresh(); });
      return b;
    }));
  }
  for (const b of box.children) {
    const s = d.stats[b.dataset.class] || {}, on = b.dataset.class === state.selected;
    const note = s.last_price != null ? ` ${tokens(s.last_price)} ${change(s)}` : "";
    if (b.lastChild.textContent !== note) b.lastChild.textContent = note;
    b.className = on ? "active" : "";
    b.setAttribute("aria-pressed", String(on));
  }
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
  let quote = b ? `${b.best_bid != null ? tokens(b.best_bid) : "—"} / ${b.best_ask != null ? tokens(b.best_ask) : "—"}` : "—";
  if (b && b.best_bid != null && b.best_ask != null && b.spread == null && !b.tradable) {
    quote += " (mixed terms: this bid and this ask differ in plan, SLO or memory, so they cannot trade with each other; pick terms in the order book to see what trades)";
  }
  el("stat-quote").textContent = quote;
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

// "new" for a provider with no value settled on chain (its reliability is only the prior).
const reliabilityText = (r, hasHistory) => (hasHistory === false ? "new" : pct(r));

function reliabilityCell(r, hasHistory) {
  const td = cell(reliabilityText(r, hasHistory));
  if (hasHistory === false) {
    td.className = "new";
    td.title = "no deal of this provider has settled on chain yet";
  }
  return td;
}

function distinct(values) {
  return [...new Set(values.filter((v) => v))].sort();
}

function shownOffers() {
  const f = el("offer-filters").elements;
  return state.offers.filter((o) => (!f.provider.value || o.provider === f.provider.value)
    && (!f.device_kind.value || o.device_kind === f.device_kind.value));
}

function renderOffers() {
  const f = el("offer-filters").elements;
  const plans = state.book ? state.book.choices.plans : [];
  setOptions(f.plan, plans, (v) => v);
  const kinds = new Map(state.offers.map((o) => [o.provider, o.device_kind]));
  setOptions(f.provider, distinct(state.offers.map((o) => o.provider)),
    (v) => short(v) + (kinds.get(v) ? ` (${kinds.get(v)})` : ""));
  setOptions(f.device_kind, distinct(state.offers.map((o) => o.device_kind)), (v) => v);
  showFilterErrors();
  for (const b of document.querySelectorAll("#offers-card th button")) {
    const field = b.dataset.sort, on = state.sort.replace("-", "") === field;
    b.parentElement.setAttribute("aria-sort", on ? (state.sort.startsWith("-") ? "descending" : "ascending") : "none");
    b.className = on ? "sorted" : "";
  }
  renderKeyed(el("offers"), shownOffers(), (o) => JSON.stringify(o), (o) => {
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
    return row([last, cell(tokens(o.price), "price"), cell(fmt(o.quantity)), who,
      reliabilityCell(o.reliability, o.has_history), cell(`${fmt(o.slo_ms)} ms`), cell(bytes(o.memory)),
      cell(o.plan, "l"), cell(fmt(o.capacity))], "offer");
  });
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

// A provider's advertised URL: a link only if it is http(s); anything else is shown as text.
function endpointCell(url) {
  const td = cell("", "l");
  let parsed = null;
  try { parsed = url ? new URL(url) : null; } catch (err) { parsed = null; }
  if (parsed && (parsed.protocol === "http:" || parsed.protocol === "https:")) {
    const a = document.createElement("a");
    a.href = parsed.href;
    a.rel = "noopener noreferrer nofollow";
    a.textContent = parsed.host;
    td.appendChild(a);
  } else {
    td.textContent = url || "—";
  }
  return td;
}

function renderProviders(d) {
  el("providers").replaceChildren(...d.providers.map((p) => row([
    cell(short(p.address) + (p.online ? "" : " (offline)"), "l"), cell(p.device_class, "l"),
    cell(p.device_kind, "l"), cell(fmt(p.device_count)), cell(tokens(p.price)),
    cell(Number(p.throughput).toFixed(2)), reliabilityCell(p.reliability, p.has_history),
    cell(`${tokens(p.paid)} (${p.clients}) / ${tokens(p.refunded)} + ${tokens(p.penalties)}`),
    cell(ago(p.last_seen)), endpointCell(p.endpoint),
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

// What a person's action changed, said once in the live region (not on every live update).
function announce() {
  const shown = shownOffers().length, b = state.book;
  const errors = Object.keys(state.errors).length;
  let text = `${shown} offer${shown === 1 ? "" : "s"}`;
  if (b) text += `, ${b.bids.length} bid and ${b.asks.length} ask levels`;
  if (state.selected) text += ` for ${state.selected}`;
  if (errors) text += `; ${errors} filter${errors === 1 ? "" : "s"} not applied`;
  el("announce").textContent = text;
}

function userRefresh() {
  state.asked += 1;
  refresh();
}

el("book-filters").addEventListener("change", () => userRefresh());
el("offer-filters").addEventListener("change", () => userRefresh());
el("offer-filters").addEventListener("submit", (e) => e.preventDefault());
for (const b of document.querySelectorAll("#offers-card th button")) {
  b.addEventListener("click", () => {
    const field = b.dataset.sort;
    const current = state.sort.replace("-", "");
    if (current === field) state.sort = state.sort.startsWith("-") ? field : "-" + field;
    else state.sort = SORT_DESCENDING_FIRST.has(field) ? "-" + field : field;
    userRefresh();
  });
}
window.addEventListener("resize", () => { if (state.data) render(); });
refresh();
connect();
