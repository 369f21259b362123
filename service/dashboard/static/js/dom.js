// Small helpers to build the page without HTML strings (nothing from the API is ever parsed as HTML).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// Redraw a part of the page that refreshes itself without taking the keyboard focus away:
// the focused link or button inside it is focused again in the new content.
export function keepFocus(container, redraw) {
  const was = document.activeElement;
  const key = container.contains(was) && was !== container ? focusKey(was) : null;
  redraw();
  if (!key) return;
  const again = [...container.querySelectorAll(was.tagName)].find((el) => focusKey(el) === key);
  again?.focus();
}

function focusKey(el) {
  return `${el.tagName}|${el.id}|${el.getAttribute("href") || ""}|${el.getAttribute("aria-label") || el.textContent}`;
}

export function link(href, ...children) {
  return h("a", { href }, ...children);
}

export function badge(status) {
  return h("span", { class: `badge s-${status}` }, status);
}

export function table(headers, rows, { empty = "Nothing here yet." } = {}) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h(
    "div",
    { class: "tablewrap" },
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", typeof x === "string" ? {} : { class: x.cls }, x.label ?? x)))),
      h("tbody", {}, rows),
    ),
  );
}

export function panel(title, ...children) {
  return h("section", { class: "panel" }, title ? h("h2", {}, title) : null, ...children);
}

export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(([, v]) => v !== undefined && v !== null && v !== "").map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))),
  );
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const ago = (Date.now() - d.getTime()) / 1000;
  const text = d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
  return h("time", { datetime: iso, title: d.toISOString() }, ago >= 0 && ago < 86400 ? `${duration(ago)} ago` : text);
}

export function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "";
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function runtime(job) {
  if (!job.started_at) return "";
  const end = job.finished_at ? new Date(job.finished_at) : new Date();
  return duration((end - new Date(job.started_at)) / 1000);
}

export function num(v) {
  if (typeof v !== "number") return v === undefined || v === null ? "" : String(v);
  if (Number.isInteger(v)) return v.toLocaleString();
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : v.toPrecision(4).replace(/\.?0+$/, "");
}

export function labels(obj) {
  return Object.entries(obj || {}).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`));
}

export function errorNotice(err) {
  return h("div", { class: "notice error", role: "alert" }, err.message || String(err));
}

// A job's progress: epoch or step of its budget, from its latest report.
export function progress(job) {
  const m = job.latest_metrics || {};
  const spec = job.spec || {};
  const budget = spec.budget || {};
  const epochs = spec.epochs ?? budget.epochs;
  const steps = spec.max_steps ?? budget.steps;
  let text = "";
  let frac = null;
  if (epochs && m.epoch !== undefined) {
    text = `epoch ${m.epoch}/${epochs}`;
    frac = m.epoch / epochs;
  } else if (steps && m.step !== undefined) {
    text = `step ${m.step}/${steps}`;
    frac = m.step / steps;
  } else if (m.step !== undefined) text = `step ${m.step}`;
  else if (m.epoch !== undefined) text = `epoch ${m.epoch}`;
  if (job.status === "SUCCEEDED") frac = 1;
  if (!text) return job.status === "SUCCEEDED" ? "done" : "";
  const bar = frac === null ? null : h("div", { class: "bar", role: "presentation" }, h("span"));
  if (bar) bar.firstChild.style.width = `${Math.min(100, Math.max(0, frac * 100)).toFixed(0)}%`;
  return h("div", {}, text, bar);
}

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
