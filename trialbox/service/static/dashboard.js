// The live view: polls /api/dashboard and redraws. Numbers carry data-testid attributes
// (the browser test reads them).
import { html, render, useEffect, useRef, useState } from "/static/vendor/htm-preact-standalone.module.js";
import { Header, ago, fmt, getJSON, makeChart, pct, traceHref } from "/static/common.js";

const STATES = ["queued", "admitted", "running", "grading", "done", "failed", "excluded"];

function Chart({ title, series, data, yRange }) {
  const el = useRef(null);
  const chart = useRef(null);
  useEffect(() => {
    if (!el.current) return;
    if (!chart.current) chart.current = makeChart(el.current, title, series, data, yRange);
    else chart.current.setData(data);
  });
  return html`<div ref=${el}></div>`;
}

function Tasks({ tasks }) {
  const names = [...new Set([...STATES.filter((s) => s in tasks), ...Object.keys(tasks)])];
  if (!names.length) return html`<div class="muted">no tasks reported yet</div>`;
  return html`<div class="kv">${names.map((s) => html`
    <span class="k">${s}</span><span data-testid=${"tasks-" + s}>${fmt(tasks[s])}</span>`)}</div>`;
}

function Histogram({ counts }) {
  const max = Math.max(1, ...counts);
  return html`<div data-testid="reward-hist">
    <div class="bars">${counts.map((c) => html`
      <div style=${`height:${(100 * c) / max}%`} title=${c}><span>${c || ""}</span></div>`)}</div>
    <div class="axis">${counts.map((_, i) => html`<span>${(i / counts.length).toFixed(1)}</span>`)}</div>
  </div>`;
}

function Events({ events, traceUrl }) {
  if (!events.length) return html`<div class="muted" data-testid="events">nothing failed or flagged</div>`;
  return html`<table data-testid="events"><thead><tr><th>when</th><th>kind</th><th>what</th><th>trace</th></tr></thead>
    <tbody>${events.map((e) => html`<tr>
      <td class="muted">${ago(e.t)}</td><td><span class=${"tag " + e.kind}>${e.kind}</span></td>
      <td>${e.summary}</td>
      <td>${e.trace_id ? html`<a href=${traceHref(e.trace_id, traceUrl)}>${e.trace_id.slice(0, 8)}</a>` : "–"}</td>
    </tr>`)}</tbody></table>`;
}

function Alerts({ alerts }) {
  // alerts.yml's rules, evaluated in-process by the server (trialbox/telemetry/alerts.py)
  if (!alerts.length) return html`<div class="muted" data-testid="alerts">no alert pending or firing</div>`;
  return html`<table data-testid="alerts"><thead><tr><th>alert</th><th>state</th><th>value</th><th>since</th></tr></thead>
    <tbody>${alerts.map((a) => html`<tr title=${a.description}>
      <td><span class=${"tag " + (a.state === "firing" ? "infra" : "flag")}>${a.name}</span>
        ${Object.entries(a.labels).map(([k, v]) => html` <span class="muted">${k}=${v}</span>`)}</td>
      <td data-testid=${"alert-" + a.name}>${a.state} (${a.severity})</td><td>${fmt(a.value, 3)}</td>
      <td class="muted">${ago(a.since)}</td></tr>`)}</tbody></table>`;
}

function Kv({ rows }) {
  return html`<div class="kv">${rows.map(([k, v, id]) => html`
    <span class="k">${k}</span><span data-testid=${id}>${v}</span>`)}</div>`;
}

function App() {
  const [d, setD] = useState(null);
  const [err, setErr] = useState(null);
  useEffect(() => {
    let timer = null, poll = 1000, stop = false;
    const tick = async () => {
      try {
        const body = await getJSON("/api/dashboard");
        poll = body.config.poll_ms;
        setD(body); setErr(null);
      } catch (e) { setErr(String(e.message || e)); }
      if (!stop) timer = setTimeout(tick, poll);
    };
    tick();
    return () => { stop = true; clearTimeout(timer); };
  }, []);
  if (!d) return html`<${Header} page="live" /><main>${err ? html`<div class="err">${err}</div>` : "loading…"}</main>`;
  const t = d.totals, s = d.series, lat = d.latency_ms;
  const outcomes = Object.entries(t.outcomes);
  const statuses = Object.entries(t.executions_by_status);
  const svc = d.service;
  return html`<${Header} page="live" />
  <main>
    ${err && html`<div class="err">${err} (showing the last answer)</div>`}
    <div class="muted" style="margin-bottom:8px">updated <span data-testid="updated-at">${new Date(d.now * 1000).toLocaleTimeString()}</span></div>
    <div class="grid">
      <div class="card"><h2>Sandbox runs</h2><div class="big" data-testid="executions-total">${fmt(t.executions)}</div>
        <div class="muted"><span data-testid="exec-per-s">${fmt(d.throughput.executions_per_s, 2)}</span>/s over ${d.window_s} s</div></div>
      <div class="card"><h2>Graded attempts</h2><div class="big" data-testid="gradings-total">${fmt(t.gradings)}</div>
        <div class="muted"><span data-testid="grade-per-s">${fmt(d.throughput.gradings_per_s, 2)}</span>/s · rewards ${fmt(t.rewards)} · excluded ${fmt(t.rewards_excluded)}</div></div>
      <div class="card"><h2>Sandbox pool</h2><${Kv} rows=${[
        ["ready (warm)", fmt(d.pool.ready), "pool-ready"], ["in use", fmt(d.pool.in_use), "pool-in-use"],
        ["starting", fmt(d.pool.warming), "pool-warming"],
        ["cells started", fmt(t.starts.ok || 0), "starts-ok"], ["start failures", fmt(t.starts.failed || 0), "starts-failed"]]} /></div>
      <div class="card"><h2>Latency (ms, last ${d.window_s} s)</h2><${Kv} rows=${[
        ["run p50", fmt(lat.exec_p50), "exec-p50"], ["run p95", fmt(lat.exec_p95), "exec-p95"],
        ["run p99", fmt(lat.exec_p99), "exec-p99"], ["cell start p50", fmt(lat.start_p50, 2), "start-p50"],
        ["cell start p95", fmt(lat.start_p95, 2), "start-p95"]]} /></div>
      <div class="card"><h2>Infrastructure failures</h2>
        <div class=${"big " + (d.infra_failure_rate ? "bad" : "ok")} data-testid="infra-rate">${pct(d.infra_failure_rate)}</div>
        <div class="muted">of runs and gradings, last ${d.window_s} s · ${fmt(t.infra_failures)} in total</div></div>
      <div class="card"><h2>Tasks by state</h2><${Tasks} tasks=${d.tasks} /></div>
      <div class="card"><h2>Queues</h2>${Object.keys(d.queues).length
        ? html`<${Kv} rows=${Object.entries(d.queues).map(([q, n]) => [q, fmt(n), "queue-" + q])} />`
        : html`<div class="muted">no queue reported</div>`}</div>
      ${svc && html`<div class="card"><h2>HTTP service</h2><${Kv} rows=${[
        ["requests", fmt(svc.requests), "svc-requests"], ["running", fmt(svc.running), "svc-running"],
        ["queued", fmt(svc.queued), "svc-queued"], ["sessions", fmt(svc.sessions), "svc-sessions"],
        ...Object.entries(svc.responses || {}).map(([c, n]) => ["HTTP " + c, fmt(n), "svc-" + c])]} /></div>`}
    </div>
    <div class="wide">
      <div class="card"><h2>Throughput (per s, 5 s bins)</h2><${Chart} title="" data=${[s.t, s.exec_per_s, s.grade_per_s]}
        series=${[{ label: "runs/s", stroke: "#2f5bea" }, { label: "gradings/s", stroke: "#1a7f37" }]} /></div>
      <div class="card"><h2>Run latency p50 (ms)</h2><${Chart} title="" data=${[s.t, s.exec_p50_ms]}
        series=${[{ label: "p50 ms", stroke: "#b26a00" }]} /></div>
      <div class="card"><h2>Reward over time (mean, quartiles)</h2><${Chart} title="" data=${[s.t, s.reward_mean, s.reward_p25, s.reward_p75]}
        yRange=${[0, 1]} series=${[{ label: "mean", stroke: "#2f5bea", width: 2, points: { show: true } }, { label: "p25", stroke: "#9db0f5" }, { label: "p75", stroke: "#9db0f5" }]} /></div>
      <div class="card"><h2>Reward distribution (last ${d.window_s} s)</h2><${Histogram} counts=${d.reward_histogram} /></div>
    </div>
    <div class="wide">
      <div class="card"><h2>Outcomes</h2>${outcomes.length ? html`<table data-testid="outcomes"><tbody>${outcomes.map(([o, n]) => html`
        <tr><td><span class=${"tag " + o}>${o}</span></td><td>${fmt(n)}</td></tr>`)}</tbody></table>` : html`<div class="muted">nothing graded yet</div>`}
        <h2 style="margin-top:12px">Runs by status</h2>${statuses.length ? html`<table data-testid="statuses"><tbody>${statuses.map(([o, n]) => html`
        <tr><td>${o}</td><td>${fmt(n)}</td></tr>`)}</tbody></table>` : html`<div class="muted">no runs yet</div>`}
        <h2 style="margin-top:12px">Anti-cheat flags</h2>${Object.keys(t.flags).length ? html`<table data-testid="flags"><tbody>${Object.entries(t.flags).map(([f, n]) => html`
        <tr><td><span class="tag flag">${f}</span></td><td>${fmt(n)}</td></tr>`)}</tbody></table>` : html`<div class="muted">none fired</div>`}</div>
      <div class="card"><h2>Recent failures and flags</h2><${Events} events=${d.events} traceUrl=${d.config.trace_url} /></div>
    </div>
    <div class="card"><h2>Alerts</h2><${Alerts} alerts=${d.alerts || []} /></div>
    <div class="card"><h2>Training runs</h2>${d.runs.length ? html`<table data-testid="runs"><thead><tr><th>run</th><th>steps</th><th>last step</th><th>reward mean</th></tr></thead>
      <tbody>${d.runs.map((r) => html`<tr><td><a href=${"/runs/" + encodeURIComponent(r.run_id)}>${r.run_id}</a></td>
        <td>${fmt(r.steps)}</td><td>${fmt(r.last_step)}</td><td>${fmt(r.reward_mean, 3)}</td></tr>`)}</tbody></table>`
      : html`<div class="muted">no training steps reported in this process</div>`}</div>
  </main>`;
}

render(html`<${App} />`, document.getElementById("app"));
