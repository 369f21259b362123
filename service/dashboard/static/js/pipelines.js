// The pipelines pages: the list of the caller's pipelines, and one pipeline as a graph
// (its steps in columns by how many steps run before them, each with its status, the
// edges of `after` solid and of `init_from` dashed), with its steps' table, cancel and resume.

import { get, post, query } from "./api.js";
import { h, replace, keepFocus, table, link, badge, when, TERMINAL } from "./dom.js";
import { setTitle, handleError, setStatus, confirmAction } from "./frame.js";
import { every } from "./router.js";
import { s } from "./svg.js";

const REFRESH_MS = 3000;
const NODE_W = 168, NODE_H = 52, COL_GAP = 96, ROW_GAP = 22, PAD = 16, TOP = 36;

export async function pipelinesPage(main, { signal }) {
  setTitle("Pipelines");
  const count = h("span", { class: "muted" });
  const body = h("div", { id: "pipelines" }, h("p", { class: "muted" }, "Loading pipelines…"));
  replace(main, h("div", { class: "pagehead" }, h("div", {}, h("h1", {}, "Pipelines"), count)), h("section", { class: "panel" }, body));
  const load = async () => {
    const page = await get("/pipelines" + query({ limit: 100 }), signal);
    replace(count, `${page.items.length} pipeline${page.items.length === 1 ? "" : "s"}`);
    const rows = page.items.map((p) =>
      h(
        "tr",
        { dataset: { pipeline: p.id } },
        h("td", {}, link(`/pipelines/${encodeURIComponent(p.id)}`, h("strong", {}, p.name)), h("div", { class: "muted small mono" }, p.id)),
        h("td", {}, p.project),
        h("td", {}, badge(p.status)),
        h("td", {}, `${p.steps.filter((st) => TERMINAL.has(st.status)).length}/${p.steps.length} ended`),
        h("td", {}, when(p.created_at)),
      ),
    );
    keepFocus(body, () =>
      replace(body, table(["Name", "Project", "Status", "Steps", "Submitted"], rows, { empty: "No pipelines yet. Submit one with `raydock pipeline submit pipeline.yaml` or POST /v1/pipelines." })),
    );
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  };
  await load();
  every(REFRESH_MS, signal, () => load().catch(handleError));
}

export async function pipelinePage(main, { params, signal }) {
  const id = params.id;
  const head = h("div", { class: "pagehead" });
  const drawing = h("div", { id: "graph", class: "graphwrap" });
  const steps = h("div", { id: "steps" });
  replace(main, head, h("section", { class: "panel" }, h("h2", {}, "Graph"), drawing), h("section", { class: "panel" }, h("h2", {}, "Steps"), steps));
  const load = async () => {
    const p = await get(`/pipelines/${encodeURIComponent(id)}`, signal);
    setTitle(p.name, "Pipelines");
    replace(head, h("div", {}, h("h1", {}, p.name, " ", badge(p.status)), h("div", { class: "muted small mono" }, `${p.id} · ${p.project}`)), actions(p, load));
    replace(drawing, graph(p));
    keepFocus(steps, () => replace(steps, stepsTable(p)));
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
    return p;
  };
  await load();
  every(REFRESH_MS, signal, () => load().catch(handleError));
}

function actions(p, reload) {
  const live = p.steps.some((st) => !TERMINAL.has(st.status));
  const again = p.steps.some((st) => st.status === "FAILED" || st.status === "CANCELLED");
  const act = (what, label, ask) =>
    h(
      "button",
      {
        type: "button",
        onclick: async (e) => {
          if (ask && !(await confirmAction(`${label} ${p.name}?`, ask, label))) return;
          e.target.disabled = true;
          try {
            await post(`/pipelines/${encodeURIComponent(p.id)}/${what}`);
            await reload();
          } catch (err) {
            handleError(err);
            e.target.disabled = false;
          }
        },
      },
      label,
    );
  return h(
    "div",
    { class: "actions" },
    live ? act("cancel", "Cancel pipeline", "Every step that has not ended is cancelled.") : null,
    !live && again ? act("resume", "Resume pipeline", null) : null,
  );
}

// Each step's column: 0 for a step that runs after no other step, else one more than the
// furthest of those it runs after.
function columns(p) {
  const byName = new Map(p.steps.map((st) => [st.name, st]));
  const col = new Map();
  const depth = (name, seen = new Set()) => {
    if (col.has(name)) return col.get(name);
    if (seen.has(name)) return 0;
    seen.add(name);
    const deps = inputs(byName.get(name)).filter((e) => byName.has(e.from));
    const d = deps.length ? 1 + Math.max(...deps.map((e) => depth(e.from, seen))) : 0;
    col.set(name, d);
    return d;
  };
  p.steps.forEach((st) => depth(st.name));
  return col;
}

function inputs(st) {
  const edges = st.after.filter((a) => a.step).map((a) => ({ from: a.step, to: st.name, status: a.status || "SUCCEEDED", init: false }));
  if (st.init_from && st.init_from.step) edges.push({ from: st.init_from.step, to: st.name, status: st.init_from.checkpoint || "best", init: true });
  return edges;
}

function graph(p) {
  const col = columns(p);
  const rows = new Map();
  const at = new Map();
  for (const st of p.steps) {
    const c = col.get(st.name);
    const r = rows.get(c) || 0;
    rows.set(c, r + 1);
    at.set(st.name, { x: PAD + c * (NODE_W + COL_GAP), y: TOP + r * (NODE_H + ROW_GAP), c });
  }
  const width = PAD * 2 + (Math.max(...col.values()) + 1) * (NODE_W + COL_GAP) - COL_GAP;
  const height = TOP + PAD + Math.max(...rows.values()) * (NODE_H + ROW_GAP) - ROW_GAP;
  const edges = p.steps.flatMap(inputs).map((e) => {
    const a = at.get(e.from), b = at.get(e.to);
    const [x1, y1, x2, y2] = [a.x + NODE_W, a.y + NODE_H / 2, b.x, b.y + NODE_H / 2];
    const mid = (x1 + x2) / 2;
    const label = e.init ? `init (${e.status})` : e.status === "SUCCEEDED" ? "" : `on ${e.status}`;
    // An edge over more than one column arcs above the steps between, not through them.
    const over = b.c - a.c > 1 ? Math.min(y1, y2) - NODE_H / 2 - TOP * 0.6 : null;
    const d = over === null ? `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2 - 6},${y2}` : `M${x1},${y1} C${x1 + 60},${over} ${x2 - 60},${over} ${x2 - 6},${y2}`;
    const ly = over === null ? (y1 + y2) / 2 - 5 : over + 18;
    return s(
      "g",
      { class: "edge pipeline-edge", "data-from": e.from, "data-to": e.to },
      s("path", { d, "stroke-dasharray": e.init ? "5 4" : null, "marker-end": "url(#arrow)" }),
      label ? s("text", { x: mid, y: ly, "text-anchor": "middle" }, label) : null,
    );
  });
  const nodes = p.steps.map((st) => {
    const { x, y } = at.get(st.name);
    const a = s("a", { href: `/jobs/${encodeURIComponent(st.job_id)}` },
      s("rect", { x, y, width: NODE_W, height: NODE_H, rx: 8 }),
      s("text", { x: x + 10, y: y + 20, class: "step-name" }, st.name),
      s("text", { x: x + 10, y: y + 38, class: `step-status s-${st.status}` }, st.status),
      s("title", {}, `${st.name} (${st.job_id}): ${st.status}${st.status_reason ? " — " + st.status_reason : ""}`),
    );
    return s("g", { class: `step st-${st.status}`, "data-step": st.name, "data-status": st.status }, a);
  });
  const defs = s("defs", {}, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 8, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M0,0 L10,5 L0,10 z", class: "arrowhead" })));
  return s("svg", { class: "pipeline-graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `Graph of pipeline ${p.name}: ${p.steps.length} steps` }, defs, ...edges, ...nodes);
}

function stepsTable(p) {
  const rows = p.steps.map((st) => {
    const after = st.after.map((a) => `${a.step || a.job}${a.status && a.status !== "SUCCEEDED" ? ` (${a.status})` : ""}`);
    if (st.init_from) after.push(`init_from ${st.init_from.step || st.init_from.job} (${st.init_from.checkpoint || "best"})`);
    return h(
      "tr",
      { dataset: { step: st.name } },
      h("td", {}, h("strong", {}, st.name)),
      h("td", {}, link(`/jobs/${encodeURIComponent(st.job_id)}`, st.job_id)),
      h("td", {}, badge(st.status), h("div", { class: "reason" }, st.status_reason || "")),
      h("td", {}, after.join(", ") || h("span", { class: "muted" }, "—")),
      h("td", {}, st.finished_at ? when(st.finished_at) : ""),
    );
  });
  return table(["Step", "Job", "Status", "Runs after", "Ended"], rows);
}
