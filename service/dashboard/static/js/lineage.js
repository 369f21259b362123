// PBT's lineage as a graph: one lane per trial (its node at the left), and an edge for each
// exploit, from the donor at the step it was cloned to the trial that took its weights,
// labelled with the step and the mutation. A table below says the same in words.

import { h, table, num } from "./dom.js";
import { s, scale, arrowMarker } from "./svg.js";

const LANE = 56;
const LEFT = 150;
const RIGHT = 30;
const TOP = 36;
const WIDTH = 960;

export function lineageGraph(trials, exploits, { unit = "step", best = null } = {}) {
  if (!exploits.length)
    return h("p", { class: "muted" }, "No exploit yet: PBT clones a trial at its first perturbation interval.");
  const ids = [...new Set([...trials.map((t) => t.trial_id), ...exploits.flatMap((e) => [e.trial_id, e.donor_trial_id])])].sort();
  const lane = new Map(ids.map((id, i) => [id, TOP + i * LANE]));
  const lastOf = (t) => (t.last_metrics ? Number(t.last_metrics[unit] ?? 0) : 0);
  const times = exploits.flatMap((e) => [e.donor_time ?? 0, e.trial_time ?? e.donor_time ?? 0]).concat(trials.map(lastOf));
  const x = scale(0, Math.max(1, ...times), LEFT, WIDTH - RIGHT);
  const height = TOP + ids.length * LANE;

  const lanes = ids.map((id) => {
    const y = lane.get(id);
    return s(
      "g",
      { class: `node${id === best ? " best" : ""}`, "data-trial": id },
      s("line", { class: "lane", x1: LEFT, x2: WIDTH - RIGHT, y1: y, y2: y }),
      s("circle", { cx: LEFT, cy: y, r: 7 }),
      s("text", { x: LEFT - 14, y: y + 4, "text-anchor": "end" }, id === best ? `★ ${short(id)}` : short(id)),
      s("title", {}, id),
    );
  });
  const axis = s(
    "g",
    { class: "axis" },
    x.ticks.map((t) => s("text", { x: x.at(t), y: height - 4, "text-anchor": "middle" }, num(t))),
    s("text", { x: WIDTH - RIGHT, y: height + 12, "text-anchor": "end" }, unit),
  );
  const stacked = new Map(); // labels already at a point: the next goes above them
  const edges = exploits.map((e) => {
    const x1 = x.at(e.donor_time ?? 0);
    const x2 = x.at(e.trial_time ?? e.donor_time ?? 0);
    const y1 = lane.get(e.donor_trial_id);
    const y2 = lane.get(e.trial_id);
    const bend = (y2 - y1) / 2;
    const label = `${unit} ${num(e.donor_time)}: ${mutation(e)}`;
    const at = `${e.trial_id}@${x2}`;
    const k = stacked.get(at) || 0;
    stacked.set(at, k + 1);
    const up = y2 <= y1 ? 1 : -1; // labels go on the side of the lane away from the donor
    return s(
      "g",
      { class: "edge", "data-from": e.donor_trial_id, "data-to": e.trial_id },
      s("path", { d: edgePath(x1, y1, x2, y2 + (y2 > y1 ? -5 : 5), bend), "marker-end": "url(#arrow)" }),
      s("circle", { cx: x1, cy: y1, r: 3.5, class: "dot" }),
      s("circle", { cx: x2, cy: y2, r: 3.5, class: "dot" }),
      s("text", { x: x2 + 8, y: y2 + (up > 0 ? 16 + 12 * k : -8 - 12 * k) }, label),
      s("title", {}, `${e.trial_id} cloned ${e.donor_trial_id} at ${unit} ${num(e.donor_time)}; ${mutation(e)}`),
    );
  });
  const svg = s(
    "svg",
    { viewBox: `0 0 ${WIDTH} ${height + 18}`, width: "100%", role: "img", "aria-label": `PBT lineage: ${exploits.length} exploits among ${ids.length} trials`, id: "lineage" },
    arrowMarker(),
    lanes,
    edges,
    axis,
  );
  const rows = exploits.map((e) =>
    h("tr", {}, h("td", { class: "mono" }, short(e.trial_id)), h("td", { class: "mono" }, short(e.donor_trial_id)), h("td", { class: "num" }, num(e.donor_time)), h("td", { class: "num" }, num(e.donor_metric)), h("td", {}, mutation(e))),
  );
  return h(
    "div",
    {},
    svg,
    h("details", {}, h("summary", {}, "Exploits as a table"), table(["Trial", "Cloned from", { label: unit, cls: "num" }, { label: "Donor metric", cls: "num" }, "Mutation"], rows)),
  );
}

// A bow for a clone at the donor's own step (a vertical hop), an S-curve when it moves on.
function edgePath(x1, y1, x2, y2, bend) {
  if (Math.abs(x2 - x1) < 24) return `M${x1},${y1} Q${Math.max(x1, x2) + 36},${(y1 + y2) / 2} ${x2},${y2}`;
  return `M${x1},${y1} C${x1 + 40},${y1 + bend} ${x2 - 40},${y2 - bend} ${x2},${y2}`;
}

export function mutation(e) {
  const keys = Object.keys(e.new_config || {}).filter((k) => JSON.stringify(e.new_config[k]) !== JSON.stringify(e.donor_config?.[k]));
  const changed = keys.length ? keys : Object.keys(e.new_config || {});
  return changed.map((k) => `${k.split(".").at(-1)} ${num(e.donor_config?.[k] ?? e.old_config?.[k])}→${num(e.new_config[k])}`).join(", ") || "same values";
}

export function short(id) {
  // Tune's ids are long ("train_fn_3a1b2_00001"): the tail tells trials apart.
  const m = /_(\d{5})$/.exec(id);
  return m ? `trial ${Number(m[1])}` : id.length > 18 ? "…" + id.slice(-16) : id;
}
