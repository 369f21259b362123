// A search's views: the trial table, every trial's curve on one chart, the searched values
// against the metric, PBT's lineage graph, and the best trial with its replay spec.

import { get, ApiError } from "./api.js";
import { h, replace, panel, table, badge, num, facts, when, TERMINAL } from "./dom.js";
import { handleError } from "./frame.js";
import { every } from "./router.js";
import { curvesChart, isNumber } from "./charts.js";
import { lineageGraph, short } from "./lineage.js";
import { s, scale } from "./svg.js";
import { toYaml } from "./yaml.js";

const REFRESH_MS = 4000;
const MAX_CURVES = 50;

export async function searchSections(el, currentJob, signal) {
  let job = currentJob();
  const spec = job.spec || {};
  const metric = spec.metric;
  const unit = spec.budget?.steps ? "step" : spec.budget?.epochs ? "epoch" : "step";
  const base = `/jobs/${encodeURIComponent(job.id)}`;
  const trialsBox = h("div", {}, h("p", { class: "muted" }, "Loading trials…"));
  const curvesBox = h("div", { id: "curves" });
  const scatterBox = h("div", { id: "scatter" });
  const phasesBox = h("div", { id: "trial-phases" });
  const lineageBox = h("div", { id: "lineage-box" });
  const bestBox = h("div", { id: "best" });
  replace(
    el,
    panel(`Trials · ${spec.algorithm || "search"} on ${metric} (${spec.mode})`, trialsBox),
    h("div", { class: "grid2" }, panel(`${metric} of every trial`, curvesBox), panel(`Searched values against ${metric}`, scatterBox)),
    panel("Start-up of each trial", phasesBox),
    panel("PBT lineage", lineageBox),
    panel("Best trial", bestBox),
  );

  const series = {}; // trial id -> { since, points: [[x, y]] }
  let chart = null;
  let param = null;
  signal.addEventListener("abort", () => chart?.destroy());

  const load = async () => {
    const [trials, exploits] = await Promise.all([get(`${base}/trials`, signal), get(`${base}/lineage`, signal)]);
    let best = null;
    if (trials.some((t) => t.best_metric !== null)) {
      try {
        best = await get(`${base}/best`, signal);
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
      }
    }
    replace(trialsBox, trialTable(trials, best, metric));
    replace(phasesBox, phaseTables(trials));
    for (const t of trials.slice(0, MAX_CURVES)) {
      const known = (series[t.trial_id] ||= { since: -1, points: [] });
      if (t.reports === known.points.length) continue;
      const points = await get(`${base}/trials/${encodeURIComponent(t.trial_id)}/metrics?since=${known.since}`, signal);
      for (const p of points) {
        known.since = p.seq;
        const y = p.metrics?.[metric];
        const x = p[unit] ?? p.metrics?.[unit] ?? known.points.length + 1;
        if (isNumber(y)) known.points.push([x, y]);
      }
    }
    chart?.destroy();
    const byName = Object.fromEntries(Object.entries(series).map(([id, v]) => [short(id), v.points.slice().sort((a, b) => a[0] - b[0])]));
    chart = curvesChart(curvesBox, byName, { xLabel: unit });
    const params = [...new Set(trials.flatMap((t) => Object.keys(t.config || {}).filter((k) => isNumber(t.config[k]))))];
    param = params.includes(param) ? param : params[0];
    const scatter = () =>
      drawScatter(scatterBox, trials, params, param, metric, best, (p) => {
        param = p;
        scatter();
      });
    scatter();
    replace(
      lineageBox,
      spec.algorithm === "pbt" || exploits.length
        ? lineageGraph(trials, exploits, { unit, best: best?.trial_id })
        : h("p", { class: "muted" }, `A ${spec.algorithm} search clones no trial; the lineage of a PBT search shows here.`),
    );
    drawBest(bestBox, job, best, base);
  };
  await load();
  let finalLoad = false;
  every(REFRESH_MS, signal, () => {
    job = currentJob();
    if (finalLoad) return;
    finalLoad = TERMINAL.has(job.status); // one more load after the end, then stop
    return load().catch(handleError);
  });
}

function trialTable(trials, best, metric) {
  const params = [...new Set(trials.flatMap((t) => Object.keys(t.config || {})))];
  const rows = trials.map((t) =>
    h(
      "tr",
      { dataset: { trial: t.trial_id }, class: best?.trial_id === t.trial_id ? "best" : null },
      h("td", { class: "mono", title: t.trial_id }, best?.trial_id === t.trial_id ? "★ " : "", short(t.trial_id)),
      h("td", {}, badge(t.status), t.stopped_early ? h("div", { class: "reason" }, "stopped early") : null),
      params.map((k) => h("td", { class: "num" }, num(t.config?.[k]))),
      h("td", { class: "num" }, num(t.best_metric)),
      h("td", { class: "num" }, String(t.reports)),
      h("td", { class: "num" }, t.exploits ? String(t.exploits) : ""),
      h("td", { class: "small" }, t.error ? h("span", { class: "error" }, t.error.split("\n")[0]) : null, t.note || ""),
    ),
  );
  return table(
    ["Trial", "Status", ...params.map((k) => ({ label: k, cls: "num" })), { label: `Best ${metric}`, cls: "num" }, { label: "Reports", cls: "num" }, { label: "Exploits", cls: "num" }, "Note"],
    rows,
    { empty: "No trial has started yet." },
  );
}

// Seconds after the trial was queued (start) or after PBT's exploit decision (restarts).
const secs = (v) => (v === null || v === undefined ? "" : `${num(v)} s`);

function phaseTables(trials) {
  const starts = trials.map((t) =>
    h(
      "tr",
      { dataset: { phaseTrial: t.trial_id } },
      h("td", { class: "mono", title: t.trial_id }, short(t.trial_id)),
      ["placed", "first_step", "first_metric"].map((k) => h("td", { class: "num" }, secs(t.start_phases?.[k]))),
    ),
  );
  const restarts = trials.flatMap((t) =>
    (t.exploit_phases || []).map((e) =>
      h(
        "tr",
        { dataset: { phaseTrial: t.trial_id } },
        h("td", { class: "mono", title: t.trial_id }, short(t.trial_id)),
        h("td", {}, when(new Date(e.at * 1000).toISOString())),
        ["paused", "restored", "first_step", "first_metric"].map((k) => h("td", { class: "num" }, secs(e[k]))),
      ),
    ),
  );
  const n = { cls: "num" };
  return [
    h("p", { class: "muted" }, "Seconds after the trial was queued: its Train workers placed, rank 0's first step, its first report."),
    table(["Trial", { label: "Placed", ...n }, { label: "First step", ...n }, { label: "First metric", ...n }], starts, { empty: "No trial has started yet." }),
    restarts.length
      ? [
          h("h3", {}, "Restarts after PBT exploits"),
          h("p", { class: "muted" }, "Seconds after PBT decided the clone: the trial's run stopped, restored from the donor, its first step and report after."),
          h("div", { id: "exploit-phases" }, table(["Trial", "Decided", { label: "Paused", ...n }, { label: "Restored", ...n }, { label: "First step", ...n }, { label: "First metric", ...n }], restarts)),
        ]
      : null,
  ];
}

// One searched value against the trials' best metric; a log axis when the values span decades.
function drawScatter(el, trials, params, param, metric, best, choose) {
  if (!params.length) return replace(el, h("p", { class: "muted" }, "No numeric searched value."));
  const select = h(
    "select",
    { id: "scatter-param", "aria-label": "Searched value on the x axis", onchange: (e) => choose(e.target.value) },
    params.map((p) => h("option", { value: p, selected: p === param }, p)),
  );
  const pts = trials.filter((t) => isNumber(t.config?.[param]) && isNumber(t.best_metric));
  const W = 480;
  const H = 260;
  const M = { l: 56, r: 14, t: 10, b: 36 };
  let body;
  if (!pts.length) body = h("p", { class: "muted" }, "No trial has reported the metric yet.");
  else {
    const xs = pts.map((t) => t.config[param]);
    const ys = pts.map((t) => t.best_metric);
    const lo = Math.min(...xs);
    const hi = Math.max(...xs);
    const x = scale(lo, hi, M.l, W - M.r, { log: lo > 0 && hi / lo > 20, pad: 0.08 });
    const y = scale(Math.min(...ys), Math.max(...ys), H - M.b, M.t, { pad: 0.08 });
    body = s(
      "svg",
      { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": `${param} against ${metric}` },
      s("g", { class: "axis" }, x.ticks.map((v) => s("text", { x: x.at(v), y: H - M.b + 16, "text-anchor": "middle" }, num(v))), s("text", { x: (W + M.l) / 2, y: H - 4, "text-anchor": "middle" }, param)),
      s("g", { class: "axis" }, y.ticks.map((v) => s("text", { x: M.l - 6, y: y.at(v) + 4, "text-anchor": "end" }, num(v))), s("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b }), s("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b })),
      pts.map((t) =>
        s("circle", { class: `dot${t.trial_id === best?.trial_id ? " best" : ""}`, cx: x.at(t.config[param]), cy: y.at(t.best_metric), r: 6 }, s("title", {}, `${short(t.trial_id)}: ${param}=${num(t.config[param])}, ${metric}=${num(t.best_metric)}`)),
      ),
    );
  }
  replace(el, h("div", { class: "row" }, h("label", { for: "scatter-param" }, "x axis"), select), body);
}

function drawBest(el, job, best, base) {
  if (!best) return replace(el, h("p", { class: "muted" }, "No trial has reported the metric yet."));
  const out = h("div", { id: "replay" });
  const finished = job.status === "SUCCEEDED";
  const button = h(
    "button",
    {
      type: "button",
      id: "show-replay",
      disabled: !finished,
      onclick: async () => {
        try {
          const spec = await get(`${base}/best/replay`);
          replace(out, h("p", { class: "muted small" }, "Submit this spec (raydock submit replay.yaml) to train the best trial again:"), h("pre", { tabindex: 0 }, toYaml(spec)));
        } catch (err) {
          replace(out, h("p", { class: "error" }, err.message));
        }
      },
    },
    "Show its replay spec",
  );
  replace(
    el,
    facts([
      ["Trial", short(best.trial_id)],
      [`${best.metric} (${best.mode})`, num(best.value)],
      ["Final", best.final ? "yes" : "best so far"],
      ...Object.entries(best.config || {}).map(([k, v]) => [k, num(v)]),
    ]),
    best.checkpoint ? h("p", { class: "small" }, "Checkpoint ", h("code", {}, best.checkpoint.path)) : null,
    h("div", { class: "row" }, button, finished ? null : h("span", { class: "muted small" }, "The replay spec is ready once the search has succeeded.")),
    out,
  );
}
