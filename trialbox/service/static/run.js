// A training run's page: the reward curve (and other scalars) per step.
import { html, render, useEffect, useRef, useState } from "/static/vendor/htm-preact-standalone.module.js";
import { Header, fmt, getJSON } from "/static/common.js";

const runId = decodeURIComponent(location.pathname.split("/").pop());
const COLORS = ["#2f5bea", "#c62828", "#1a7f37", "#b26a00", "#7b1fa2", "#00838f"];

function Curve({ steps, name, values, color }) {
  const el = useRef(null), chart = useRef(null);
  useEffect(() => {
    const data = [steps, values];
    if (!chart.current) {
      chart.current = new window.uPlot({
        width: Math.max(300, el.current.clientWidth - 4), height: 220,
        scales: { x: { time: false } }, series: [{ label: "step" }, { label: name, stroke: color, width: 2 }],
        axes: [{ label: "step" }, { size: 55 }],
      }, data, el.current);
    } else chart.current.setData(data);
  });
  return html`<div ref=${el} data-testid=${"curve-" + name}></div>`;
}

function App() {
  const [d, setD] = useState(null), [err, setErr] = useState(null);
  useEffect(() => {
    let timer = null;
    const tick = async () => {
      try { setD(await getJSON(`/api/runs/${encodeURIComponent(runId)}`)); setErr(null); }
      catch (e) { setErr(String(e.message || e)); }
      timer = setTimeout(tick, 2000);
    };
    tick();
    return () => clearTimeout(timer);
  }, []);
  const names = d ? Object.keys(d.scalars).sort((a, b) => (a === "reward_mean" ? -1 : b === "reward_mean" ? 1 : a.localeCompare(b))) : [];
  const last = d && d.steps.length ? d.steps.length - 1 : -1;
  return html`<${Header} page="run" /><main>
    <h2>Run <span data-testid="run-id">${runId}</span></h2>
    ${err && html`<div class="err">${err}</div>`}
    ${d && html`<div class="grid">
      <div class="card"><h2>Steps</h2><div class="big" data-testid="run-steps">${fmt(d.steps.length)}</div></div>
      ${names.map((n) => html`<div class="card"><h2>${n} (last)</h2><div class="big" data-testid=${"last-" + n}>${fmt(last >= 0 ? d.scalars[n][last] : null, 3)}</div></div>`)}
    </div>
    <div class="wide">${names.map((n, i) => html`<div class="card"><h2>${n === "reward_mean" ? "Reward curve (mean reward per step)" : n}</h2>
      <${Curve} steps=${d.steps} name=${n} values=${d.scalars[n]} color=${COLORS[i % COLORS.length]} /></div>`)}</div>`}
  </main>`;
}

render(html`<${App} />`, document.getElementById("app"));
