// Charts with uPlot (vendored, window.uPlot): one chart per reported metric of a job, fed
// by the stored history and then the live stream, and one chart of many trials' curves.

import { h } from "./dom.js";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#9333ea", "#ea580c"];
const NOT_SERIES = new Set(["epoch", "step", "trial_id", "seq", "ts", "attempt"]);

export const color = (i) => PALETTE[i % PALETTE.length];

function themeColors() {
  const css = getComputedStyle(document.documentElement);
  return { text: css.getPropertyValue("--muted").trim(), grid: css.getPropertyValue("--chart-grid").trim() };
}

function axes(xLabel) {
  const { text, grid } = themeColors();
  const axis = { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } };
  return [{ ...axis, label: xLabel, labelSize: 20 }, { ...axis, size: 60 }];
}

function widthOf(el) {
  return Math.max(280, Math.floor(el.getBoundingClientRect().width) - 4);
}

// Keep charts as wide as their boxes.
function watchWidth(el, plot) {
  const ro = new ResizeObserver(() => plot.setSize({ width: widthOf(el), height: plot.height }));
  ro.observe(el);
  return ro;
}

export const isNumber = (v) => typeof v === "number" && Number.isFinite(v);

export class MetricCharts {
  constructor(container, { empty = "No metrics reported yet." } = {}) {
    this.container = container;
    this.charts = new Map(); // metric -> { plot, xs, ys, box }
    this.empty = h("p", { class: "muted" }, empty);
    this.container.replaceChildren(this.empty);
    this.pending = false;
    this.count = 0;
  }

  add(points) {
    for (const p of points) {
      for (const [key, value] of Object.entries(p.metrics || {})) {
        if (NOT_SERIES.has(key) || !isNumber(value)) continue;
        const c = this.charts.get(key) || this.create(key);
        if (c.xs.length && p.seq <= c.xs[c.xs.length - 1]) continue; // already drawn
        c.xs.push(p.seq);
        c.ys.push(value);
      }
      this.count++;
    }
    this.schedule();
  }

  create(key) {
    this.empty.remove();
    const box = h("figure", { class: "chart panel", dataset: { metric: key } }, h("h3", {}, key));
    const holder = h("div");
    box.append(holder);
    // Keep the charts in name order, so loss and val_loss sit side by side.
    const after = [...this.container.children].find((el) => el.dataset.metric > key);
    this.container.insertBefore(box, after || null);
    const xs = [];
    const ys = [];
    const plot = new uPlot(
      {
        width: widthOf(holder),
        height: 200,
        scales: { x: { time: false } },
        axes: axes("report"),
        legend: { live: true },
        series: [{ label: "report" }, { label: key, stroke: color(this.charts.size), width: 1.5, points: { show: false } }],
      },
      [xs, ys],
      holder,
    );
    const c = { plot, xs, ys, box, ro: watchWidth(holder, plot) };
    this.charts.set(key, c);
    return c;
  }

  // Redraw at most once a frame however fast points arrive.
  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      for (const c of this.charts.values()) {
        c.plot.setData([c.xs, c.ys]);
        c.box.dataset.points = c.xs.length; // what is drawn, for a reader (and the browser tests)
      }
    });
  }

  destroy() {
    for (const c of this.charts.values()) {
      c.ro.disconnect();
      c.plot.destroy();
    }
  }
}

// Several named series on one chart, each with its own x values (trials of a search).
export function curvesChart(container, seriesByName, { xLabel = "step", yLabel = "" } = {}) {
  const names = Object.keys(seriesByName).filter((n) => seriesByName[n].length);
  if (!names.length) {
    container.replaceChildren(h("p", { class: "muted" }, "No reports yet."));
    return null;
  }
  const data = uPlot.join(names.map((n) => [seriesByName[n].map((p) => p[0]), seriesByName[n].map((p) => p[1])]));
  const holder = h("div");
  container.replaceChildren(holder);
  const plot = new uPlot(
    {
      width: widthOf(holder),
      height: 280,
      scales: { x: { time: false } },
      axes: axes(xLabel),
      series: [
        { label: xLabel },
        ...names.map((n, i) => ({ label: n, stroke: color(i), width: 1.5, spanGaps: true, points: { show: false } })),
      ],
    },
    data,
    holder,
  );
  const ro = watchWidth(holder, plot);
  return { plot, destroy: () => (ro.disconnect(), plot.destroy()), yLabel };
}
