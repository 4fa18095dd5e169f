// The dashboard: one EventSource on /dashboard/events. Its first event holds the last
// minutes of chart points; each later one a snapshot of `tokenwire status --json` and
// its chart point. Charts are inline SVG drawn here; every text goes in as textContent.
"use strict";

const WINDOW_S = 300;  // the charts' time span
const COLORS = ["#2f6fdb", "#d9534f", "#2e9e57", "#c98a12", "#7b4fc9", "#1b9aaa", "#b0447e"];
const SVG = "http://www.w3.org/2000/svg";
const points = [];
let updates = 0;

const $ = (id) => document.getElementById(id);

function fmt(v, digits = 1, unit = "") {
  return v === null || v === undefined ? "-" : v.toFixed(digits) + unit;
}

function el(tag, attrs = {}, text = null) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const step = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= v) return m * step;
  return 10 * step;
}

// series: [{name, values: [[t, v|null], ...]}]
function drawChart(svg, series, now) {
  const W = 480, H = 180, L = 44, R = 8, T = 8, B = 20;
  svg.replaceChildren();
  let top = 0;
  for (const s of series) for (const [, v] of s.values) if (v !== null && v > top) top = v;
  top = niceMax(top * 1.1);
  const x = (t) => L + ((t - (now - WINDOW_S)) / WINDOW_S) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    svg.append(el("svg:line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    svg.append(el("svg:text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }, String(+v.toPrecision(3))));
  }
  for (const ago of [300, 240, 180, 120, 60, 0]) {
    svg.append(el("svg:text", { x: x(now - ago), y: H - 6, "text-anchor": "middle" }, ago ? `-${ago / 60}m` : "now"));
  }
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    let d = "", pen = "M";
    for (const [t, v] of s.values) {
      if (t < now - WINDOW_S) continue;
      if (v === null || v === undefined) { pen = "M"; continue; }
      d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = "L";
    }
    svg.append(el("svg:path", { class: "line", d, stroke: color, "data-series": s.name }));
    svg.append(el("svg:text", { x: L + 6 + (i % 3) * 140, y: T + 10 + Math.floor(i / 3) * 11, fill: color, style: `fill:${color}` }, s.name.slice(-22)));
  });
}

function perMember(key) {
  const names = new Set();
  for (const p of points) for (const k of Object.keys(p[key] || {})) names.add(k);
  return [...names].sort().map((name) => ({ name, values: points.map((p) => [p.at, p[key]?.[name] ?? null]) }));
}

function drawCharts() {
  const now = points.length ? points[points.length - 1].at : Date.now() / 1000;
  drawChart($("chart-tokens"), perMember("tokens_per_s"), now);
  drawChart($("chart-ttft"), [
    { name: "p50", values: points.map((p) => [p.at, p.ttft_p50_ms]) },
    { name: "p99", values: points.map((p) => [p.at, p.ttft_p99_ms]) },
  ], now);
  drawChart($("chart-queue"), [{ name: "queued requests", values: points.map((p) => [p.at, p.queue_depth]) }], now);
  drawChart($("chart-kv"), perMember("kv_used_pct"), now);
}

function state(row) {
  return row.state === "live" ? "live" : `SILENT ${Math.round(row.last_seen_s)}s`;
}

function fillTable(id, rows, cells) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = el("tr", { "data-id": row.id ?? "" });
    for (const [text, cls] of cells(row)) tr.append(el("td", cls ? { class: cls } : {}, String(text)));
    body.append(tr);
  }
}

function showStatus(s, point) {
  $("at").textContent = new Date(s.at * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  const live = s.workers.filter((w) => w.state === "live");
  const tokens = live.reduce((n, w) => n + (w.tokens_per_s || 0), 0);
  $("total-tokens").textContent = fmt(tokens);
  $("total-ttft-p50").textContent = fmt(point.ttft_p50_ms, 0, " ms");
  $("total-ttft-p99").textContent = fmt(point.ttft_p99_ms, 0, " ms");
  $("total-queue").textContent = String(point.queue_depth);
  $("total-streams").textContent = String(s.edges.filter((e) => e.state === "live").reduce((n, e) => n + e.open_streams, 0));
  $("total-dlq").textContent = s.dlq && s.dlq.size !== undefined ? String(s.dlq.size) : "-";
  const silent = (r) => (r.state === "live" ? "" : "silent");
  fillTable("workers", s.workers, (w) => [
    [w.id], [state(w), silent(w)], [w.partitions.join(",") || "-"], [w.running, "num"], [w.waiting, "num"],
    [fmt(w.kv_used_pct, 0, "%"), "num"], [fmt(w.prefix_hit_pct, 0, "%"), "num"], [fmt(w.tokens_per_s), "num"],
    [fmt(w.ttft_p50_ms, 0, " ms"), "num"], [fmt(w.ttft_p99_ms, 0, " ms"), "num"],
  ]);
  fillTable("batchers", s.batchers, (b) => [
    [b.id], [state(b), silent(b)], [b.queued_requests, "num"], [b.queued_tokens, "num"], [b.paused ? "yes" : "no"],
    [fmt(b.window_ms, 0, " ms"), "num"],
    [Object.entries(b.queued_by_priority).map(([p, n]) => `${p}=${n}`).join(" ") || "-"],
  ]);
  fillTable("edges", s.edges, (e) => [
    [e.id], [e.serving ? state(e) : "NOT SERVING", silent(e)], [e.address], [e.open_streams, "num"],
    [fmt(e.requests_per_s), "num"], [fmt(e.submitted_per_s), "num"], [`${Math.round(e.uptime_s)} s`, "num"],
  ]);
  const bus = [];
  for (const [group, lag] of Object.entries(s.consumer_lag)) {
    const parts = Object.entries(lag.partitions).map(([p, n]) => `p${p}=${n}`).join(" ");
    bus.push({ id: group, cells: [`lag ${group}`, `${lag.total}  (${parts})`] });
  }
  if (s.dlq && s.dlq.topic) bus.push({ id: "dlq", cells: [`dead letters ${s.dlq.topic}`, s.dlq.size] });
  if (s.redis && s.redis.used_memory_human) {
    const cap = s.redis.maxmemory ? s.redis.maxmemory_human : "no limit";
    bus.push({ id: "redis", cells: ["redis memory", `${s.redis.used_memory_human} (peak ${s.redis.peak_human}, ${cap})`] });
  }
  fillTable("bus", bus, (r) => r.cells.map((c) => [c]));
  $("problems").replaceChildren(...s.problems.map((p) => el("li", {}, p)));
}

function connect() {
  const source = new EventSource("/dashboard/events");
  source.onopen = () => { $("conn").textContent = "live"; $("conn").className = "conn live"; };
  source.onerror = () => { $("conn").textContent = "reconnecting"; $("conn").className = "conn lost"; };
  source.onmessage = (msg) => {
    const ev = JSON.parse(msg.data);
    if (ev.history) {
      points.length = 0;
      points.push(...ev.history);
    } else {
      if (!points.length || points[points.length - 1].at < ev.point.at) points.push(ev.point);
      while (points.length && points[0].at < ev.point.at - WINDOW_S) points.shift();
      showStatus(ev.status, ev.point);
      updates += 1;
      document.body.dataset.updates = String(updates);
    }
    drawCharts();
  };
}

drawCharts();
connect();
