// One trace: its spans as an indented timeline, then the log lines that carry its id.
import { html, render, useEffect, useState } from "/static/vendor/htm-preact-standalone.module.js";
import { Header, fmt, getJSON } from "/static/common.js";

const traceId = location.pathname.split("/").pop();

function order(spans) {
  const kids = new Map(), ids = new Set(spans.map((s) => s.span_id)), out = [];
  for (const s of spans) {
    const p = s.parent_id && ids.has(s.parent_id) ? s.parent_id : null;
    if (!kids.has(p)) kids.set(p, []);
    kids.get(p).push(s);
  }
  const walk = (p, depth) => (kids.get(p) || []).forEach((s) => { out.push([s, depth]); walk(s.span_id, depth + 1); });
  walk(null, 0);
  return out;
}

function App() {
  const [d, setD] = useState(null), [err, setErr] = useState(null);
  useEffect(() => { getJSON(`/api/traces/${traceId}`).then(setD, (e) => setErr(String(e.message || e))); }, []);
  if (err) return html`<${Header} page="trace" /><main><div class="err">${err}</div></main>`;
  if (!d) return html`<${Header} page="trace" /><main>loading…</main>`;
  const rows = order(d.spans);
  const end = Math.max(1e-6, ...d.spans.map((s) => s.start_ms + s.duration_ms));
  return html`<${Header} page="trace" /><main>
    <h2>Trace ${traceId}</h2>
    ${!rows.length && html`<div class="err">no spans of this trace are kept in this process (it keeps the most recent ones only; with OTLP export configured, look it up in your tracing backend)</div>`}
    <div class="card" style="margin-bottom:12px"><table data-testid="spans"><thead><tr><th>span</th><th>start ms</th><th>ms</th><th style="width:35%"></th><th>attributes</th></tr></thead>
      <tbody>${rows.map(([s, depth]) => html`<tr>
        <td style=${`padding-left:${6 + depth * 18}px`}><b>${s.name}</b>${s.status === "ERROR" ? html` <span class="tag infra">error</span>` : ""}</td>
        <td>${fmt(s.start_ms, 2)}</td><td>${fmt(s.duration_ms, 2)}</td>
        <td><div class="span-bar" style=${`margin-left:${(100 * s.start_ms) / end}%;width:${(100 * s.duration_ms) / end}%`}></div></td>
        <td class="muted">${Object.entries(s.attributes).map(([k, v]) => html`<span class="tag">${k}=${String(v)}</span>`)}</td>
      </tr>`)}</tbody></table></div>
    <div class="card"><h2>Log lines of this trace</h2>${d.logs.length ? html`<pre data-testid="logs">${d.logs.map((l) => JSON.stringify(l)).join("\n")}</pre>`
      : html`<div class="muted">none kept</div>`}</div>
  </main>`;
}

render(html`<${App} />`, document.getElementById("app"));
