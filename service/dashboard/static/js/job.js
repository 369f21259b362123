// A job's page: what it is and why it is in its status, its live charts (or, for a search,
// the search's views), its log, checkpoints, attempts and worker groups, and its spec.

import { get, post, del, download, streamEvents } from "./api.js";
import { h, replace, keepFocus, badge, table, when, runtime, progress, labels, facts, panel, num, TERMINAL, errorNotice } from "./dom.js";
import { setTitle, handleError, setStatus, confirmAction } from "./frame.js";
import { navigate, every } from "./router.js";
import { MetricCharts } from "./charts.js";
import { logPanel } from "./joblog.js";
import { searchSections } from "./search.js";
import { short } from "./lineage.js";
import { toYaml } from "./yaml.js";

const REFRESH_MS = 3000;
const HISTORY_POINTS = 1000; // a few points per pixel of a chart's width

export async function jobPage(main, { params, signal }) {
  const id = params.id;
  const base = `/jobs/${encodeURIComponent(id)}`;
  // The chart's history is asked for at once, beside the job: it is what takes longest to draw.
  const history = get(`${base}/metrics?max_points=${HISTORY_POINTS}`, signal);
  history.catch(() => {}); // a search has no series of its own; a refusal shows through the job's read
  let job = await get(base, signal);
  setTitle(job.name, "Job");

  const head = h("div", { class: "pagehead" });
  const alerts = h("div", { "aria-live": "polite" });
  const summary = h("section", { class: "panel", "aria-label": "Summary" });
  const phases = h("div");
  const checkpoints = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const groups = h("div");
  const specBox = h("pre", { class: "spec", tabindex: 0, "aria-label": "Job spec as YAML" }, toYaml(job.spec));
  const charts = h("div", { class: "charts", id: "charts" });
  const isSearch = job.kind === "tune";

  replace(
    main,
    head,
    alerts,
    summary,
    phases,
    isSearch ? h("div", { id: "search" }) : panel("Metrics", charts),
    logPanel(id, signal),
    h(
      "div",
      { class: "grid2" },
      panel("Checkpoints", checkpoints),
      panel("Attempts, restarts and worker groups", groups),
    ),
    panel("Spec", specBox),
  );

  const act = (label, cls, title, text, ok, run) =>
    h("button", {
      type: "button",
      class: cls,
      onclick: async () => {
        if (!(await confirmAction(title, text, ok))) return;
        try {
          await run();
        } catch (err) {
          replace(alerts, errorNotice(err));
        }
      },
    }, label);

  const drawHead = () => {
    const actions = [];
    if (!TERMINAL.has(job.status) && job.status !== "CANCELLING")
      actions.push(
        act("Cancel", "danger", `Cancel ${job.name}?`, "Its Ray job is stopped and its workers released. You can resume it later from its last checkpoint.", "Cancel job", async () => {
          job = await post(`${base}/cancel`);
          draw();
        }),
      );
    if (job.status === "FAILED" || job.status === "CANCELLED")
      actions.push(
        act("Resume", "", `Resume ${job.name}?`, "A new attempt starts from the job's last checkpoint.", "Resume", async () => {
          job = await post(`${base}/resume`);
          draw();
        }),
      );
    if (TERMINAL.has(job.status))
      actions.push(
        act("Delete", "danger", `Delete ${job.name}?`, "The job, its metrics, logs and checkpoint files are deleted for good.", "Delete job", async () => {
          await del(base);
          navigate("/", { replace: true });
        }),
      );
    replace(
      head,
      h(
        "div",
        {},
        h("h1", {}, job.name, " ", badge(job.status)),
        h("div", { class: "muted mono small" }, `${job.kind} · ${job.id}`),
        statusLine(job),
      ),
      h("div", { class: "row", role: "group", "aria-label": "Actions" }, actions),
    );
  };

  const drawSummary = () => {
    const latest = Object.entries(job.latest_metrics || {})
      .filter(([k]) => k !== "trial_id")
      .map(([k, v]) => h("span", { class: "label" }, `${k}=${num(v)}`));
    replace(
      summary,
      facts([
        ["Progress", progress(job)],
        ["Runtime", runtime(job)],
        ["Created", when(job.created_at)],
        ["Started", when(job.started_at)],
        ["Finished", when(job.finished_at)],
        ["Attempts", String(job.attempt)],
        ["Restarts", String(job.restarts_total)],
        ["Labels", Object.keys(job.labels || {}).length ? labels(job.labels) : null],
        ["Ray job", job.ray_job_id],
        ["Dropped events", job.dropped_events ? `${job.dropped_events} (${job.last_dropped_reason || ""})` : null],
      ]),
      latest.length ? h("div", { class: "latest" }, h("span", { class: "muted small" }, "Latest metrics "), latest) : null,
      job.status === "FAILED" || job.error
        ? h(
            "div",
            { class: "failure", role: "alert" },
            h("h3", { class: "error" }, `Failed: ${job.failure_cause || "unknown cause"}`),
            job.error ? h("pre", { class: "error-text" }, job.error) : null,
          )
        : null,
    );
    replace(phases, job.start_phases ? panel("Start-up phases", startPhases(job.start_phases)) : null);
  };

  const draw = () => {
    keepFocus(head, drawHead);
    drawSummary();
    drawGroups(groups, job, workerGroups);
  };

  let workerGroups = [];
  const loadParts = async () => {
    const [cps, wgs] = await Promise.all([get(`${base}/checkpoints`, signal), get(`${base}/worker-groups`, signal)]);
    workerGroups = wgs;
    keepFocus(checkpoints, () => drawCheckpoints(checkpoints, job, cps, base));
    drawGroups(groups, job, workerGroups);
  };

  draw();
  if (isSearch) searchSections(main.querySelector("#search"), () => job, signal).catch(handleError);
  else liveMetrics(base, history, new MetricCharts(charts), job, signal).catch(handleError);
  await loadParts();

  every(REFRESH_MS, signal, async () => {
    if (TERMINAL.has(job.status) && job.finished_at && Date.now() - new Date(job.finished_at) > 60_000) return;
    try {
      job = await get(base, signal);
      draw();
      await loadParts();
      setStatus(`updated ${new Date().toLocaleTimeString()}`);
    } catch (err) {
      handleError(err);
    }
  });
}

function statusLine(job) {
  const reason = [job.status === "QUEUED" && job.queue_position ? `#${job.queue_position} in the queue` : null, job.status_reason]
    .filter(Boolean)
    .join(" · ");
  return reason ? h("p", { class: "status-line", id: "status-reason" }, reason) : null;
}

// The stored series (downsampled to a chart's worth), then every new report live.
async function liveMetrics(base, history, charts, job, signal) {
  signal.addEventListener("abort", () => charts.destroy());
  const points = await history;
  charts.add(points);
  if (TERMINAL.has(job.status)) return;
  const since = points.length ? points.at(-1).seq : -1;
  await streamEvents(`${base}/metrics/stream?since=${since}`, signal, (type, data) => {
    if (type === "metric") charts.add([data]);
  });
}

function drawCheckpoints(el, job, cps, base) {
  const rows = cps.map((c) =>
    h(
      "tr",
      {},
      h("td", { class: "num" }, String(c.id)),
      h("td", { class: "num" }, c.epoch ?? ""),
      h("td", { class: "num" }, c.step ?? ""),
      h("td", {}, Object.entries(c.metrics || {}).filter(([k]) => k !== "epoch" && k !== "step").slice(0, 4).map(([k, v]) => h("span", { class: "label" }, `${k}=${num(v)}`))),
      h("td", {}, when(c.created_at)),
      h(
        "td",
        {},
        h("button", {
          type: "button",
          "aria-label": `Download checkpoint ${c.id}`,
          onclick: async (e) => {
            const b = e.currentTarget;
            b.disabled = true;
            b.textContent = "Downloading…";
            try {
              await download(`${base}/checkpoints/${c.id}/download`, `${job.name}-${job.id}-checkpoint-${c.id}.tar.gz`);
              b.textContent = "Download";
            } catch (err) {
              b.textContent = "Retry download";
              handleError(err);
            }
            b.disabled = false;
          },
        }, "Download"),
      ),
    ),
  );
  replace(el, table([{ label: "#", cls: "num" }, { label: "Epoch", cls: "num" }, { label: "Step", cls: "num" }, "Metrics", "Saved", ""], rows, { empty: "No checkpoints yet." }));
}

function drawGroups(el, job, wgs) {
  const restarts = (job.restarts || []).map((r) =>
    h("tr", {}, h("td", { class: "num" }, String(r.attempt)), h("td", {}, when(new Date(r.at * 1000).toISOString())), h("td", { class: "small" }, r.reason)),
  );
  const trials = wgs.some((g) => g.trial_id); // a search: each trial's Train runs start their own
  const groups = wgs.map((g) => {
    const nodes = {};
    for (const n of g.nodes) nodes[n.ip] = (nodes[n.ip] || 0) + 1;
    return h(
      "tr",
      {},
      h("td", { class: "num" }, String(g.seq)),
      h("td", { class: "num" }, String(g.attempt)),
      trials ? h("td", { class: "mono", title: g.trial_id || "" }, g.trial_id ? short(g.trial_id) : "") : null,
      h("td", {}, when(new Date(g.ts * 1000).toISOString())),
      h("td", { class: "num" }, String(g.world_size)),
      h("td", { class: "mono small" }, Object.entries(nodes).map(([ip, n]) => `${ip} ×${n}`).join(", ")),
    );
  });
  replace(
    el,
    h("p", {}, `${job.attempt} attempt${job.attempt === 1 ? "" : "s"}, ${job.restarts_total} restart${job.restarts_total === 1 ? "" : "s"} from checkpoint.`),
    restarts.length ? [h("h3", {}, "Restarts"), table([{ label: "Attempt", cls: "num" }, "When", "Why"], restarts)] : null,
    h("h3", {}, "Worker groups"),
    table([{ label: "#", cls: "num" }, { label: "Attempt", cls: "num" }, ...(trials ? ["Trial"] : []), "Started", { label: "Workers", cls: "num" }, "Nodes"], groups, { empty: "No worker group has started yet." }),
  );
}

// Start-up phases (GET /v1/jobs/{id} start_phases): each phase reached, in order, in seconds
// after the attempt was queued (its POST or resume), and how long it took after the one before.
function startPhases(value) {
  let before = null;
  const rows = Object.entries(value || {}).map(([name, at]) => {
    const took = before === null ? "" : `+${num(at - before)} s`;
    before = at;
    return h("tr", {}, h("td", {}, name), h("td", { class: "num" }, `${num(at)} s`), h("td", { class: "num" }, took));
  });
  return table(["Phase", { label: "After POST", cls: "num" }, { label: "Took", cls: "num" }], rows);
}
