// A job's log, following until the job ends, with a search box that keeps the matching lines.

import { followLog } from "./api.js";
import { h, replace, panel } from "./dom.js";
import { handleError } from "./frame.js";

const KEEP_CHARS = 2_000_000; // the newest 2 MB on screen; the whole log is at /v1/jobs/{id}/logs
const MAX_MATCHES = 2000;
// Terminal colours and cursor moves in worker output (Ray prefixes each line with one).
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;

export function logPanel(jobId, signal) {
  let text = "";
  let dropped = false;
  let pending = false;
  const pre = h("pre", { class: "log", id: "log", tabindex: 0, "aria-label": "Job log" }, "Waiting for the log…");
  const search = h("input", { type: "search", id: "log-search", placeholder: "Search the log", "aria-label": "Search the log" });
  const follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
  const info = h("span", { class: "muted small", id: "log-info" });

  const draw = () => {
    pending = false;
    const needle = search.value;
    if (!needle) {
      pre.textContent = (dropped ? "[earlier output not shown]\n" : "") + (text || "No output yet.");
      info.textContent = "";
    } else {
      const lower = needle.toLowerCase();
      const lines = text.split("\n").filter((l) => l.toLowerCase().includes(lower));
      const shown = lines.slice(-MAX_MATCHES);
      replace(pre, shown.map((l) => [highlight(l, needle), "\n"]));
      info.textContent = `${lines.length} matching line${lines.length === 1 ? "" : "s"}${lines.length > MAX_MATCHES ? ` (the last ${MAX_MATCHES} shown)` : ""}`;
    }
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  };
  const schedule = () => {
    if (!pending) {
      pending = true;
      requestAnimationFrame(draw);
    }
  };
  search.addEventListener("input", schedule);
  follow.addEventListener("change", schedule);

  followLog(jobId, signal, (piece) => {
    text += piece.replace(ANSI, "");
    if (text.length > KEEP_CHARS) {
      text = text.slice(text.indexOf("\n", text.length - KEEP_CHARS) + 1);
      dropped = true;
    }
    schedule();
  })
    .then(() => {
      if (!text) pre.textContent = "The job wrote no output.";
    })
    .catch(handleError);

  return panel(
    "Log",
    h("div", { class: "row" }, search, h("label", { for: "log-follow" }, follow, "Follow"), info),
    h("div", { class: "log-wrap" }, pre),
  );
}

function highlight(line, needle) {
  const out = [];
  const lower = line.toLowerCase();
  const n = needle.toLowerCase();
  let at = 0;
  for (let i = lower.indexOf(n); i >= 0; i = lower.indexOf(n, at)) {
    out.push(line.slice(at, i), h("mark", {}, line.slice(i, i + needle.length)));
    at = i + needle.length;
  }
  out.push(line.slice(at));
  return out;
}
