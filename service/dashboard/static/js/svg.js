// SVG helpers for the drawings uPlot does not make: the PBT lineage graph and the scatter.

const NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, v);
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

// A linear or logarithmic scale from [lo, hi] onto [a, b], with a few round ticks.
export function scale(lo, hi, a, b, { log = false, pad = 0 } = {}) {
  if (lo === hi) {
    lo = log ? lo / 2 : lo - Math.abs(lo || 1) * 0.1;
    hi = log ? hi * 2 : hi + Math.abs(hi || 1) * 0.1;
  } else if (pad) {
    // room around the extreme points, so none sits on the frame
    const span = log ? Math.log10(hi / lo) * pad : (hi - lo) * pad;
    [lo, hi] = log ? [lo / 10 ** span, hi * 10 ** span] : [lo - span, hi + span];
  }
  const f = log ? Math.log10 : (v) => v;
  const [flo, fhi] = [f(lo), f(hi)];
  const at = (v) => a + ((f(v) - flo) / (fhi - flo)) * (b - a);
  const ticks = [];
  if (log) {
    for (let e = Math.floor(flo); e <= Math.ceil(fhi); e++) if (e >= flo - 1e-9 && e <= fhi + 1e-9) ticks.push(10 ** e);
    if (ticks.length < 2) ticks.push(lo, hi);
  } else {
    const step = niceStep((hi - lo) / 4);
    for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) ticks.push(+v.toPrecision(12));
  }
  return { at, ticks };
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw));
  const m = raw / p;
  return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
}

export function arrowMarker() {
  return s("defs", {}, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M0,0 L10,5 L0,10 z" })));
}
