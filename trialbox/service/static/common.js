// Shared helpers of the dashboard pages (ES module; no network but this server).
import { html } from "/static/vendor/htm-preact-standalone.module.js";

export async function getJSON(url, options) {
  const r = await fetch(url, options);
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const msg = body && (body.detail || body.message) ? (body.detail || body.message)
      : `${r.status} ${r.statusText}`;
    throw new Error(typeof msg === "string" ? msg : JSON.stringify(msg));
  }
  return body;
}

export function fmt(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  return v.toFixed(digits);
}

export function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%"; }

export function ago(t) {
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

export function Header({ page }) {
  const link = (href, name, key) =>
    html`<a href=${href} class=${page === key ? "on" : ""}>${name}</a>`;
  return html`<header>
    <a class="brand" href="/">trialbox</a>
    ${link("/", "Live", "live")} ${link("/review", "Review", "review")}
    <span class="right" id="clock"></span>
  </header>`;
}

export function traceHref(traceId, template) {
  if (!traceId) return null;
  return template ? template.replace("{trace_id}", traceId) : `/traces/${traceId}`;
}

// A uPlot chart that keeps its instance across renders (uPlot is a global script).
export function makeChart(el, title, seriesDefs, data, yRange = null, height = 180) {
  const opts = {
    title, width: Math.max(300, el.clientWidth - 4), height,
    scales: { x: { time: true }, y: yRange ? { range: yRange } : {} },
    series: [{}, ...seriesDefs],
    axes: [{}, { size: 50 }],
  };
  return new window.uPlot(opts, data, el);
}
