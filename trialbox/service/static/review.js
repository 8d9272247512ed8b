// The spot-check review page: pick a queued episode, read everything the judge saw, mark
// its reward correct or wrong with a note; the estimated error rate updates.
import { html, render, useEffect, useState } from "/static/vendor/htm-preact-standalone.module.js";
import { Header, fmt, getJSON, pct } from "/static/common.js";

function Stats({ s }) {
  if (!s) return null;
  const ci = s.error_rate_ci;
  return html`<div class="card" style="margin-bottom:12px"><h2>Estimated reward error rate</h2>
    <div class="big" data-testid="error-rate">${pct(s.error_rate)}</div>
    <div class="muted" data-testid="error-ci">${ci ? `95% Wilson interval ${pct(ci[0])} – ${pct(ci[1])}` : "no sampled item reviewed yet"}</div>
    <div class="kv" style="margin-top:8px">
      <span class="k">sampled items reviewed</span><span data-testid="sample-reviewed">${fmt(s.sample_reviewed)}</span>
      <span class="k">… judged wrong</span><span data-testid="sample-wrong">${fmt(s.sample_wrong)}</span>
      <span class="k">reviewed / queued (all reasons)</span><span data-testid="reviewed">${fmt(s.reviewed)} / ${fmt(s.queued)}</span>
    </div>
    <div class="muted" style="margin-top:6px;font-size:12px">Only items picked by the random sample count towards the rate; anomalies (flagged, extremes, cheats…) are reviewed but would bias it.</div>
  </div>`;
}

function Turn({ t, i }) {
  const title = t.path ? html`File <code>${t.path}</code>${t.code === null ? " (deleted)" : ""}` : html`Turn ${i + 1}`;
  return html`<div><h2>${title}${t.status ? html` · <span class="tag">${t.status}</span>` : ""}</h2>
    <pre data-testid=${"code-" + i}>${t.code ?? ""}</pre>
    ${t.stdout ? html`<div class="muted">stdout</div><pre>${t.stdout}</pre>` : ""}
    ${t.stderr ? html`<div class="muted">stderr</div><pre>${t.stderr}</pre>` : ""}</div>`;
}

function Detail({ item, onVerdict, busy }) {
  const [note, setNote] = useState("");
  const [reviewer, setReviewer] = useState(localStorage.getItem("trialbox.reviewer") || "");
  useEffect(() => setNote(""), [item.id]);
  const send = (correct) => {
    localStorage.setItem("trialbox.reviewer", reviewer);
    onVerdict(item.id, correct, note, reviewer);
  };
  return html`<div class="card" data-testid="item">
    <div class="row" style="justify-content:space-between"><h2 style="margin:0">Item ${item.id} · run ${item.run_id} · row ${item.row_index}</h2>
      <span>${item.reasons.map((r) => html`<span class="tag">${r}</span>`)}</span></div>
    <div class="grid" style="margin-top:10px">
      <div><div class="muted">task</div><b data-testid="item-task">${item.task_id ?? "–"}</b></div>
      <div><div class="muted">outcome</div><span class=${"tag " + item.outcome} data-testid="item-outcome">${item.outcome ?? "–"}</span></div>
      <div><div class="muted">reward</div><b data-testid="item-reward">${item.reward === null ? "excluded (None)" : fmt(item.reward, 3)}</b></div>
      <div><div class="muted">flags</div>${item.flags.length ? item.flags.map((f) => html`<span class="tag flag">${f}</span>`) : "none"}</div>
    </div>
    ${item.message && html`<div class="muted">judge's message</div><pre>${item.message}</pre>`}
    <h2>Task</h2><pre data-testid="item-prompt">${item.prompt ?? "(the row carries no prompt)"}</pre>
    ${item.turns.length ? item.turns.map((t, i) => html`<${Turn} t=${t} i=${i} />`) : html`<div class="muted">(the row carries no code)</div>`}
    <h2>Tests</h2>${item.tests.length ? html`<table data-testid="item-tests"><thead><tr><th>test</th><th>result</th><th>ms</th><th>message</th></tr></thead><tbody>
      ${item.tests.map((t) => html`<tr><td>${t.name}${t.hidden ? html` <span class="tag">hidden</span>` : ""}</td>
        <td><span class=${"tag " + (t.passed ? "passed" : "wrong")}>${t.passed ? "pass" : "fail"}</span></td>
        <td>${fmt(t.ms, 2)}</td><td class="muted">${t.message}</td></tr>`)}</tbody></table>` : html`<div class="muted">no per-test evidence</div>`}
    <h2 style="margin-top:14px">Verdict</h2>
    ${item.verdict && html`<div data-testid="item-verdict" style="margin-bottom:8px">Recorded: <span class=${"tag " + (item.verdict.correct ? "correct" : "wrong")}>${item.verdict.correct ? "reward correct" : "reward wrong"}</span>
      ${item.verdict.reviewer && html` by ${item.verdict.reviewer}`} at ${item.verdict.recorded_at}${item.verdict.note && html` — “${item.verdict.note}”`}</div>`}
    <div class="row" style="margin-bottom:8px"><input placeholder="reviewer" value=${reviewer} data-testid="reviewer" onInput=${(e) => setReviewer(e.target.value)} style="max-width:220px" /></div>
    <textarea rows="3" placeholder="note: why the reward is right or wrong" value=${note} data-testid="note" onInput=${(e) => setNote(e.target.value)}></textarea>
    <div class="row" style="margin-top:8px">
      <button class="good" disabled=${busy} data-testid="verdict-correct" onClick=${() => send(true)}>Reward is correct</button>
      <button class="badb" disabled=${busy} data-testid="verdict-wrong" onClick=${() => send(false)}>Reward is wrong</button>
    </div>
  </div>`;
}

function App() {
  const [state, setState] = useState("pending");
  const [runId, setRunId] = useState("");
  const [list, setList] = useState(null);
  const [runs, setRuns] = useState([]);
  const [item, setItem] = useState(null);
  const [err, setErr] = useState(null);
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState(null);

  const q = () => `state=${state}${runId ? "&run_id=" + encodeURIComponent(runId) : ""}`;
  const load = async (selectFirst) => {
    try {
      const [l, s] = await Promise.all([getJSON(`/api/review/items?${q()}`), getJSON("/api/review/stats")]);
      setList(l); setRuns(s.runs); setErr(null);
      if (selectFirst && l.items.length) open(l.items[0].id);
      if (selectFirst && !l.items.length) setItem(null);
    } catch (e) { setErr(String(e.message || e)); }
  };
  const open = async (id) => {
    try { setItem(await getJSON(`/api/review/items/${id}`)); } catch (e) { setErr(String(e.message || e)); }
  };
  const verdict = async (id, correct, note, reviewer) => {
    setBusy(true);
    try {
      const r = await getJSON(`/api/review/items/${id}/verdict`, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ correct, note, reviewer }) });
      setSaved({ id, correct });
      await open(id);
      await load(false);
      return r;
    } catch (e) { setErr(String(e.message || e)); }
    finally { setBusy(false); }
  };
  useEffect(() => { load(true); }, [state, runId]);

  return html`<${Header} page="review" /><main>
    ${err && html`<div class="err" data-testid="review-error">${err}</div>`}
    ${saved && html`<div class="card" data-testid="saved" style="margin-bottom:12px">Stored: item ${saved.id} — reward ${saved.correct ? "correct" : "wrong"}</div>`}
    <div class="split">
      <div>
        <${Stats} s=${list && list.stats} />
        <div class="card">
          <div class="row" style="margin-bottom:8px">
            <select value=${state} onChange=${(e) => setState(e.target.value)} data-testid="state">
              <option value="pending">pending</option><option value="reviewed">reviewed</option><option value="all">all</option></select>
            <select value=${runId} onChange=${(e) => setRunId(e.target.value)} data-testid="run">
              <option value="">every run</option>${runs.map((r) => html`<option value=${r}>${r}</option>`)}</select>
          </div>
          ${list && (list.items.length ? html`<table data-testid="items"><thead><tr><th>#</th><th>task</th><th>outcome</th><th>reward</th><th>why</th></tr></thead>
            <tbody>${list.items.map((i) => html`<tr class=${"click" + (item && item.id === i.id ? " sel" : "")} onClick=${() => open(i.id)} data-testid=${"item-row-" + i.id}>
              <td>${i.id}</td><td>${i.task_id}</td><td><span class=${"tag " + i.outcome}>${i.outcome}</span></td>
              <td>${i.reward === null ? "–" : fmt(i.reward, 2)}</td><td>${i.reasons.join(", ")}</td></tr>`)}</tbody></table>`
            : html`<div class="muted" data-testid="items-empty">no ${state === "all" ? "" : state} items</div>`)}
        </div>
      </div>
      <div>${item ? html`<${Detail} item=${item} onVerdict=${verdict} busy=${busy} />` : html`<div class="card muted">pick an item</div>`}</div>
    </div>
  </main>`;
}

render(html`<${App} />`, document.getElementById("app"));
