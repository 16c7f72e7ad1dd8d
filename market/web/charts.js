// Charts on <canvas> with axes: ticks at round values, tick labels, axis titles. Each chart
// writes the labels it drew into the canvas's data-axes attribute (for tests and readers).
"use strict";

const Charts = (() => {
  const MUTED = "#7d8a99", GRID = "#26313d";

  function setup(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
    if (canvas.width !== Math.round(w * ratio)) {
      canvas.width = Math.round(w * ratio);
      canvas.height = Math.round(h * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    return { ctx, w, h };
  }

  // Round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
  function ticks(lo, hi, count) {
    if (!(hi > lo)) { return [lo]; }
    const raw = (hi - lo) / Math.max(1, count);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  function text(ctx, value, x, y, align, baseline) {
    ctx.fillStyle = MUTED;
    ctx.textAlign = align || "left";
    ctx.textBaseline = baseline || "alphabetic";
    ctx.fillText(value, x, y);
  }

  // Draw a plot box with x and y axes; return mapping functions. `box` = {left, top, right, bottom}.
  function axes(canvas, ctx, w, h, spec) {
    const box = { left: 58, top: 12, right: w - 12, bottom: h - 38 };
    const x = (v) => box.left + ((v - spec.x[0]) / (spec.x[1] - spec.x[0] || 1)) * (box.right - box.left);
    const y = (v) => box.bottom - ((v - spec.y[0]) / (spec.y[1] - spec.y[0] || 1)) * (box.bottom - box.top);
    const drawn = { x: [], y: [], xTitle: spec.xTitle, yTitle: spec.yTitle };
    ctx.strokeStyle = GRID;
    ctx.lineWidth = 1;
    const xCount = Math.max(2, Math.floor((box.right - box.left) / 90));
    for (const v of (spec.xTicks || ticks)(spec.x[0], spec.x[1], xCount)) {
      const px = x(v);
      ctx.beginPath(); ctx.moveTo(px, box.top); ctx.lineTo(px, box.bottom); ctx.stroke();
      const label = spec.xFormat(v);
      const half = ctx.measureText(label).width / 2;  // kept inside the canvas at both ends
      text(ctx, label, Math.min(Math.max(px, half), w - half), box.bottom + 4, "center", "top");
      drawn.x.push(label);
    }
    for (const v of ticks(spec.y[0], spec.y[1], 4)) {
      const py = y(v);
      ctx.beginPath(); ctx.moveTo(box.left, py); ctx.lineTo(box.right, py); ctx.stroke();
      const label = spec.yFormat(v);
      text(ctx, label, box.left - 4, py, "right", "middle");
      drawn.y.push(label);
    }
    ctx.strokeStyle = MUTED;
    ctx.beginPath(); ctx.moveTo(box.left, box.top); ctx.lineTo(box.left, box.bottom);
    ctx.lineTo(box.right, box.bottom); ctx.stroke();
    text(ctx, spec.xTitle, (box.left + box.right) / 2, h - 4, "center");
    ctx.save();
    ctx.translate(10, (box.top + box.bottom) / 2);
    ctx.rotate(-Math.PI / 2);
    text(ctx, spec.yTitle, 0, 0, "center", "top");
    ctx.restore();
    canvas.dataset.axes = JSON.stringify(drawn);
    return { x, y, box };
  }

  // Time ticks on whole minutes: steps of 1, 2, 5, 10, 15 or 30 minutes, or hours.
  function timeTicks(lo, hi, count) {
    const steps = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800];
    const step = steps.find((s) => (hi - lo) / s <= count) || 10800;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) out.push(t);
    return out;
  }

  // The chart's text alternative: what a reader of the picture would take from it.
  function describe(canvas, title, summary) {
    canvas.setAttribute("aria-label", `${title}: ${summary}`);
  }

  const num = (v) => String(+v.toPrecision(6));

  function empty(canvas, ctx, message, title) {
    text(ctx, message, 10, 20);
    canvas.dataset.axes = JSON.stringify({ x: [], y: [], empty: message });
    describe(canvas, title, message);
  }

  // Cumulative units of the book's levels against price (tokens), bids green, asks red.
  function depth(canvas, book, price) {
    const { ctx, w, h } = setup(canvas);
    if (!book || (!book.bids.length && !book.asks.length)) return empty(canvas, ctx, "no resting orders", "Depth chart");
    const cum = (levels) => { let t = 0; return levels.map((l) => [price(l.price), (t += l.quantity)]); };
    const bids = cum(book.bids), asks = cum(book.asks);
    const side = (name, points) => (points.length
      ? `${name} ${points[points.length - 1][1].toLocaleString("en-US")} units from ${num(points[0][0])} to ${num(points[points.length - 1][0])} tokens`
      : `no ${name}`);
    describe(canvas, "Depth chart", `${side("bids", bids)}; ${side("asks", asks)}`);
    const prices = [...bids, ...asks].map((p) => p[0]);
    let lo = Math.min(...prices), hi = Math.max(...prices);
    if (lo === hi) { lo -= Math.abs(lo) * 0.05 || 1; hi += Math.abs(hi) * 0.05 || 1; }
    const maxQ = Math.max(1, ...bids.map((p) => p[1]), ...asks.map((p) => p[1]));
    const { x, y } = axes(canvas, ctx, w, h, {
      x: [lo, hi], y: [0, maxQ], xTitle: "price (tokens per unit)", yTitle: "cumulative units",
      xFormat: (v) => String(+v.toPrecision(6)), yFormat: (v) => v.toLocaleString("en-US"),
    });
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
  }

  // Bars [start, open, high, low, close, volume]: close line, high-low ticks, volume at the foot.
  function history(canvas, bars, price) {
    const { ctx, w, h } = setup(canvas);
    if (!bars.length) return empty(canvas, ctx, "no trades in the last 3 hours", "Price history chart");
    let lo = Math.min(...bars.map((b) => price(b[3]))), hi = Math.max(...bars.map((b) => price(b[2])));
    if (lo === hi) { lo -= Math.abs(lo) * 0.05 || 1; hi += Math.abs(hi) * 0.05 || 1; }
    const t0 = bars[0][0], t1 = Math.max(bars[bars.length - 1][0] + 60, t0 + 60);
    const clock = (t) => new Date(t * 1000).toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
    const volume = bars.reduce((sum, b) => sum + b[5], 0);
    describe(canvas, "Price history chart", `${bars.length} one-minute bars from ${clock(t0)} to ${clock(t1)}; `
      + `last close ${num(price(bars[bars.length - 1][4]))} tokens, high ${num(Math.max(...bars.map((b) => price(b[2]))))}, `
      + `low ${num(Math.min(...bars.map((b) => price(b[3]))))}; `
      + `${volume.toLocaleString("en-US")} units traded`);
    const { x, y, box } = axes(canvas, ctx, w, h, {
      x: [t0, t1], y: [lo, hi], xTitle: "time (1-minute bars)", yTitle: "price (tokens)",
      xFormat: clock, xTicks: timeTicks, yFormat: (v) => String(+v.toPrecision(6)),
    });
    const maxV = Math.max(1, ...bars.map((b) => b[5]));
    const width = Math.max(1, Math.min(12, ((box.right - box.left) * 60) / (t1 - t0) * 0.7));
    for (const b of bars) {
      const cx = x(b[0] + 30);
      const vh = (b[5] / maxV) * (box.bottom - box.top) * 0.25;
      ctx.fillStyle = "rgba(74,163,255,0.25)";
      ctx.fillRect(cx - width / 2, box.bottom - vh, width, vh);
      ctx.strokeStyle = MUTED;
      ctx.beginPath(); ctx.moveTo(cx, y(price(b[2]))); ctx.lineTo(cx, y(price(b[3]))); ctx.stroke();
    }
    ctx.strokeStyle = "#4aa3ff";
    ctx.beginPath();
    bars.forEach((b, i) => {
      const cx = x(b[0] + 30), cy = y(price(b[4]));
      if (i) ctx.lineTo(cx, cy); else ctx.moveTo(cx, cy);
    });
    ctx.stroke();
    text(ctx, "volume (max " + maxV.toLocaleString("en-US") + " units)", box.right, box.top + 10, "right");
  }

  return { depth, history, ticks };
})();
