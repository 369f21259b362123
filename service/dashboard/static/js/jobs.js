// The jobs page: newest first, filters by status and label, paging by the API's cursor
// (the same cost at any depth), refreshed every few seconds.

import { get, query } from "./api.js";
import { h, replace, badge, table, when, runtime, progress, labels, link, keepFocus } from "./dom.js";
import { setTitle, handleError, setStatus } from "./frame.js";
import { navigate, every } from "./router.js";

const STATUSES = ["", "WAITING", "QUEUED", "STARTING", "RUNNING", "CANCELLING", "PREEMPTED", "SUCCEEDED", "FAILED", "CANCELLED"];
const LIMIT = 50;
const REFRESH_MS = 3000;

export async function jobsPage(main, { search, signal }) {
  setTitle("Jobs");
  const status = search.get("status") || "";
  const label = search.get("label") || "";
  const cursor = search.get("cursor") || "";
  const back = search.getAll("back"); // cursors of the pages before this one

  const statusSelect = h(
    "select",
    { id: "f-status", name: "status" },
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s || "any status")),
  );
  const labelInput = h("input", {
    type: "text",
    id: "f-label",
    name: "label",
    placeholder: "key=value",
    value: label,
    pattern: "[^=]+=.*",
    title: "A label as key=value",
  });
  const filters = h(
    "form",
    {
      class: "row",
      role: "search",
      onsubmit: (e) => {
        e.preventDefault();
        navigate("/" + query({ status: statusSelect.value, label: labelInput.value.trim() }));
      },
    },
    h("label", { for: "f-status" }, "Status"),
    statusSelect,
    h("label", { for: "f-label" }, "Label"),
    labelInput,
    h("button", { type: "submit" }, "Filter"),
    status || label ? h("a", { href: "/", class: "button" }, "Clear") : null,
  );
  statusSelect.addEventListener("change", () => filters.requestSubmit());

  const body = h("div", { id: "jobs" }, h("p", { class: "muted" }, "Loading jobs…"));
  const pager = h("div", { class: "pager" });
  const count = h("span", { class: "muted" });
  replace(
    main,
    h("div", { class: "pagehead" }, h("div", {}, h("h1", {}, "Jobs"), count), filters),
    h("section", { class: "panel" }, body, pager),
  );

  const path = "/jobs" + query({ status, label, cursor, limit: LIMIT });
  const load = async () => {
    const page = await get(path, signal);
    replace(count, `${page.total.toLocaleString()} job${page.total === 1 ? "" : "s"}${status || label ? " match" : ""}`);
    keepFocus(body, () => replace(body, jobsTable(page.items, { filtered: Boolean(status || label) })));
    const here = { status, label };
    const newer = back.at(-1); // "_" stands for the first page
    replace(
      pager,
      back.length ? link("/" + query({ ...here, cursor: newer === "_" ? "" : newer, back: back.slice(0, -1) }), "← Newer") : null,
      page.next ? link("/" + query({ ...here, cursor: page.next, back: [...back, cursor || "_"] }), "Older →") : null,
    );
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  };
  await load();
  every(REFRESH_MS, signal, () => load().catch(handleError));
}

export function jobsTable(items, { filtered = false } = {}) {
  const rows = items.map((j) =>
    h(
      "tr",
      { dataset: { job: j.id } },
      h("td", {}, link(`/jobs/${encodeURIComponent(j.id)}`, j.name), h("div", { class: "muted small mono" }, j.id)),
      h("td", {}, j.kind),
      h("td", {}, badge(j.status), statusReason(j)),
      h("td", {}, progress(j)),
      h("td", { class: "num" }, runtime(j)),
      h("td", {}, labels(j.labels)),
      h("td", {}, when(j.created_at)),
    ),
  );
  return table(["Name", "Kind", "Status", "Progress", { label: "Runtime", cls: "num" }, "Labels", "Created"], rows, {
    empty: filtered
      ? "No job matches these filters."
      : "No jobs yet. Submit one with `raydock submit job.yaml`, the Python SDK or POST /v1/jobs.",
  });
}

function statusReason(j) {
  const parts = [];
  if (j.status === "QUEUED" && j.queue_position) parts.push(`#${j.queue_position} in the queue`);
  if (j.status_reason) parts.push(j.status_reason);
  return parts.length ? h("div", { class: "reason" }, parts.join(" · ")) : null;
}
