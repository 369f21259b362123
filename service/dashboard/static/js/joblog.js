// A job's log, following until the job ends, with a search box that keeps the matching lines.
// The job's own output is shown; the RAYDOCK_EVENT lines its driver writes to report metrics
// and checkpoints to the server are hidden unless "Show event lines" is ticked.

import { followLog } from "./api.js";
import { h, replace, panel } from "./dom.js";
import { handleError } from "./frame.js";

const KEEP_CHARS = 2_000_000; // the newest 2 MB on screen; the whole log is at /v1/jobs/{id}/logs
const MAX_MATCHES = 2000;
// Terminal colours and cursor moves in worker output (Ray prefixes each line with one).
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;
// An event line, as the server reads it out of the log (api/schemas/events.py MARKER), Ray's prefix or not.
const EVENT_LINE = /RAYDOCK_EVENT \{/;

// The log as two texts kept side by side: every line, and the job's own lines alone.
class LogText {
  constructor() {
    this.all = "";
    this.own = "";
    this.partial = ""; // a line still being written: it is classified once its newline arrives
    this.hidden = 0; // event lines taken out of `own`
    this.dropped = false;
  }

  add(piece) {
    const lines = (this.partial + piece).split("\n");
    this.partial = lines.pop();
    for (const line of lines) {
      this.all += line + "\n";
      if (EVENT_LINE.test(line)) this.hidden += 1;
      else this.own += line + "\n";
    }
    if (this.all.length > KEEP_CHARS) {
      this.all = trim(this.all);
      this.own = trim(this.own);
      this.dropped = true;
    }
  }

  shown(withEvents) {
    const tail = withEvents || !EVENT_LINE.test(this.partial) ? this.partial : "";
    return (withEvents ? this.all : this.own) + tail;
  }
}

function trim(text) {
  return text.length > KEEP_CHARS ? text.slice(text.indexOf("\n", text.length - KEEP_CHARS) + 1) : text;
}

export function logPanel(jobId, signal) {
  const log = new LogText();
  let pending = false;
  let any = false;
  const pre = h("pre", { class: "log", id: "log", tabindex: 0, "aria-label": "Job log" }, "Waiting for the log…");
  const search = h("input", { type: "search", id: "log-search", placeholder: "Search the log", "aria-label": "Search the log" });
  const follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
  const events = h("input", { type: "checkbox", id: "log-events" });
  const info = h("span", { class: "muted small", id: "log-info" });

  const draw = () => {
    pending = false;
    const text = log.shown(events.checked);
    const needle = search.value;
    const notes = [];
    if (!events.checked && log.hidden) notes.push(`${log.hidden} event line${log.hidden === 1 ? "" : "s"} hidden (raydock's reports of metrics and checkpoints)`);
    if (!needle) {
      pre.textContent = (log.dropped ? "[earlier output not shown]\n" : "") + (text || (any ? "No output of the job's own yet." : "No output yet."));
    } else {
      const lower = needle.toLowerCase();
      const lines = text.split("\n").filter((l) => l.toLowerCase().includes(lower));
      const shown = lines.slice(-MAX_MATCHES);
      replace(pre, shown.map((l) => [highlight(l, needle), "\n"]));
      notes.unshift(`${lines.length} matching line${lines.length === 1 ? "" : "s"}${lines.length > MAX_MATCHES ? ` (the last ${MAX_MATCHES} shown)` : ""}`);
    }
    info.textContent = notes.join(" · ");
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
  events.addEventListener("change", schedule);

  followLog(jobId, signal, (piece) => {
    any = true;
    log.add(piece.replace(ANSI, ""));
    schedule();
  })
    .then(() => {
      if (!any) pre.textContent = "The job wrote no output.";
    })
    .catch(handleError);

  const eventsHelp = "Lines starting RAYDOCK_EVENT are how the job reports its metrics and checkpoints to raydock; they are shown on this page as charts and tables.";
  return panel(
    "Log",
    h(
      "div",
      { class: "row" },
      search,
      h("label", { for: "log-follow" }, follow, "Follow"),
      h("label", { for: "log-events", title: eventsHelp }, events, "Show event lines"),
      info,
    ),
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
