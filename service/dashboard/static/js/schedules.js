// The schedules page: each schedule of the caller's projects with its cron, its next
// firing times, what its last tick did and the jobs it submitted; pause and resume in place.

import { get, request, query } from "./api.js";
import { h, replace, keepFocus, table, link, when, duration } from "./dom.js";
import { setTitle, handleError, setStatus } from "./frame.js";
import { every } from "./router.js";

const REFRESH_MS = 5000;
const LABEL = "raydock/schedule"; // on each job a schedule submits (api/schemas/schedules.py)

export async function schedulesPage(main, { signal }) {
  setTitle("Schedules");
  const count = h("span", { class: "muted" });
  const body = h("div", { id: "schedules" }, h("p", { class: "muted" }, "Loading schedules…"));
  replace(main, h("div", { class: "pagehead" }, h("div", {}, h("h1", {}, "Schedules"), count)), h("section", { class: "panel" }, body));

  const load = async () => {
    const page = await get("/schedules" + query({ next_runs: 3 }), signal);
    replace(count, `${page.items.length} schedule${page.items.length === 1 ? "" : "s"}`);
    keepFocus(body, () => replace(body, schedulesTable(page.items, load)));
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  };
  await load();
  every(REFRESH_MS, signal, () => load().catch(handleError));
}

function schedulesTable(items, reload) {
  const rows = items.map((s) =>
    h(
      "tr",
      { dataset: { schedule: s.id } },
      h("td", {}, h("strong", {}, s.name), h("div", { class: "muted small mono" }, s.id)),
      h("td", {}, s.project, h("div", { class: "muted small" }, `by ${s.owner}`)),
      h("td", {}, h("span", { class: "mono" }, s.cron), h("div", { class: "muted small" }, s.timezone)),
      h("td", { class: "next" }, nextRuns(s)),
      h("td", {}, `${s.concurrency}`, h("div", { class: "muted small" }, `catch-up: ${s.catch_up}`)),
      h("td", {}, lastTick(s)),
      h("td", {}, toggle(s, reload)),
    ),
  );
  return table(["Name", "Project", "Cron", "Next firing", "Overlap", "Last tick", ""], rows, {
    empty: "No schedules yet. Create one with `raydock schedule create job.yaml --cron '0 3 * * *'`, the SDK or POST /v1/schedules.",
  });
}

function nextRuns(s) {
  if (s.paused) return h("span", { class: "badge s-CANCELLED" }, "paused");
  if (!s.next_runs.length) return "";
  const [first, ...rest] = s.next_runs;
  const inS = (new Date(first) - Date.now()) / 1000;
  return h(
    "div",
    {},
    h("time", { datetime: first, title: new Date(first).toISOString() }, new Date(first).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" })),
    h("div", { class: "muted small" }, inS > 0 ? `in ${duration(inS)}` : "due now"),
    rest.length ? h("div", { class: "muted small" }, "then " + rest.map((t) => new Date(t).toLocaleString(undefined, { dateStyle: "short", timeStyle: "short" })).join(", ")) : null,
  );
}

function lastTick(s) {
  if (!s.last_tick) return h("span", { class: "muted" }, s.fired ? "" : "not fired yet");
  const jobs = link("/" + query({ label: `${LABEL}=${s.id}` }), `${s.fired} job${s.fired === 1 ? "" : "s"}`);
  const last = s.last_job_id ? link(`/jobs/${encodeURIComponent(s.last_job_id)}`, s.last_job_id) : null;
  return h("div", {}, when(s.last_tick), h("div", { class: "reason" }, s.last_outcome || ""), h("div", { class: "small" }, jobs, last ? " · last " : "", last));
}

function toggle(s, reload) {
  const label = s.paused ? "Resume" : "Pause";
  return h(
    "button",
    {
      type: "button",
      "aria-label": `${label} ${s.name}`,
      onclick: async (e) => {
        e.target.disabled = true;
        try {
          await request(`/schedules/${encodeURIComponent(s.id)}`, { method: "PATCH", body: { paused: !s.paused } });
          await reload();
        } catch (err) {
          handleError(err);
          e.target.disabled = false;
        }
      },
    },
    label,
  );
}
