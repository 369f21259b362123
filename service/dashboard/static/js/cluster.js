// The cluster: its nodes, CPUs and GPUs used and free, what the autoscaler can add, the
// queue of jobs waiting for room, in the order they will start, each node's dataset cache
// (what its keeper reports), and (for server admins) the server's replicas.

import { get, query, AuthError } from "./api.js";
import { h, replace, keepFocus, panel, table, link, num, when, labels, errorNotice } from "./dom.js";
import { setTitle, handleError, setStatus } from "./frame.js";
import { every } from "./router.js";
import { isAdmin, loadReplicas } from "./replicas.js";

const REFRESH_MS = 3000;
const QUEUE_SHOWN = 100;

export async function clusterPage(main, { signal }) {
  setTitle("Cluster");
  const cards = h("div", { class: "cards" });
  const nodes = h("div");
  const scaler = h("div");
  const queue = h("div");
  const caches = h("div");
  const replicas = h("div");
  const replicasPanel = panel("Replicas", replicas);
  replicasPanel.hidden = true; // until the listing answers: it is for server admins
  const address = h("span", { class: "muted mono small" });
  replace(
    main,
    h("div", { class: "pagehead" }, h("div", {}, h("h1", {}, "Cluster"), address)),
    cards,
    h("div", { class: "grid2" }, panel("Nodes", nodes), panel("Autoscaler", scaler)),
    panel("Queue", queue),
    panel("Dataset cache", caches),
    replicasPanel,
  );

  const admin = isAdmin(signal);
  const load = async () => {
    const [answer, queued, servers] = await Promise.all([
      get("/cluster", signal).catch((err) => err), // an unreachable cluster still leaves the queue to show
      get("/jobs" + query({ status: "QUEUED", limit: QUEUE_SHOWN }), signal),
      loadReplicas(signal, admin).catch((err) => (err instanceof AuthError ? null : [errorNotice(err)])),
    ]);
    drawQueue(queue, queued);
    replicasPanel.hidden = servers === null;
    if (servers) replace(replicas, ...servers);
    if (answer instanceof AuthError) throw answer;
    if (answer instanceof Error) {
      replace(cards, errorNotice(answer));
      replace(nodes, h("p", { class: "muted" }, "Unknown while the cluster does not answer; this page retries every few seconds."));
      replace(scaler, h("p", { class: "muted" }, "Unknown."));
      return;
    }
    const c = answer;
    address.textContent = c.address;
    const card = (title, big, sub) => h("div", { class: "card" }, h("div", { class: "muted small" }, title), h("div", { class: "big" }, big), h("div", { class: "muted small" }, sub));
    replace(
      cards,
      card("CPUs free", `${num(c.cpus_free)} / ${num(c.cpus_total)}`, `${num(c.cpus_total - c.cpus_free)} in use`),
      card("GPUs free", `${num(c.gpus_free)} / ${num(c.gpus_total)}`, c.gpus_total ? `${num(c.gpus_total - c.gpus_free)} in use` : "no GPUs in the cluster"),
      card("Nodes", String(c.nodes.filter((n) => n.alive).length), `${c.nodes.filter((n) => !n.alive).length} dead`),
      card("Queued jobs", queued.total.toLocaleString(), queued.total ? "waiting for room" : "nothing waiting"),
    );
    replace(
      nodes,
      table(
        ["Node", "Address", "Role", "State", { label: "CPUs", cls: "num" }, { label: "GPUs", cls: "num" }],
        c.nodes.map((n) =>
          h(
            "tr",
            {},
            h("td", { class: "mono small", title: n.node_id }, n.node_id.slice(0, 12)),
            h("td", { class: "mono" }, n.ip),
            h("td", {}, n.is_head ? "head" : "worker"),
            h("td", {}, h("span", { class: `badge s-${n.alive ? "SUCCEEDED" : "FAILED"}` }, n.alive ? "alive" : "dead")),
            h("td", { class: "num" }, num(n.cpus)),
            h("td", { class: "num" }, num(n.gpus)),
          ),
        ),
        { empty: "The cluster reports no node." },
      ),
    );
    drawCaches(caches, c.data_cache || []);
    const a = c.autoscaler;
    replace(
      scaler,
      !a
        ? h("p", { class: "muted" }, "No autoscaler: the cluster is the nodes above. Jobs wait in the queue until they fit.")
        : [
            h(
              "p",
              {},
              `Can add ${a.cpus_addable === null ? "any number of" : num(a.cpus_addable)} CPUs and ${a.gpus_addable === null ? "any number of" : num(a.gpus_addable)} GPUs.`,
              a.limits_from ? h("span", { class: "muted small" }, ` Limits from ${a.limits_from}.`) : null,
            ),
            table(
              ["Node type", "Resources", { label: "Running", cls: "num" }, { label: "Pending", cls: "num" }, { label: "Max", cls: "num" }],
              a.node_types.map((t) =>
                h(
                  "tr",
                  {},
                  h("td", { class: "mono" }, t.name),
                  h("td", {}, labels(Object.fromEntries(Object.entries(t.resources).map(([k, v]) => [k, num(v)])))),
                  h("td", { class: "num" }, String(t.running)),
                  h("td", { class: "num" }, String(t.pending)),
                  h("td", { class: "num" }, t.max_workers ?? "?"),
                ),
              ),
            ),
          ],
    );
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  };
  await load();
  every(REFRESH_MS, signal, () => load().catch(handleError));
}

// Binary units, as the cap (RAYDOCK_DATA_CACHE_BYTES) is usually set.
function size(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function drawCaches(el, caches) {
  replace(
    el,
    table(
      ["Node", { label: "Datasets", cls: "num" }, { label: "Size", cls: "num" }, { label: "Cap", cls: "num" }, { label: "Used", cls: "num" }, { label: "Hits", cls: "num" }, { label: "Misses", cls: "num" }, { label: "Read from sources", cls: "num" }],
      caches.map((d) =>
        h(
          "tr",
          {},
          h("td", { class: "mono small", title: d.node_id }, d.node_id.slice(0, 12)),
          h("td", { class: "num" }, d.entries.toLocaleString()),
          h("td", { class: "num" }, size(d.bytes)),
          h("td", { class: "num" }, size(d.cap_bytes)),
          h("td", { class: "num" }, d.cap_bytes ? `${Math.round((100 * d.bytes) / d.cap_bytes)}%` : "–"),
          h("td", { class: "num" }, d.hits.toLocaleString()),
          h("td", { class: "num" }, d.misses.toLocaleString()),
          h("td", { class: "num" }, size(d.source_bytes)),
        ),
      ),
      { empty: "No node has cached a dataset (the cache is on when the server sets RAYDOCK_DATA_CACHE_BYTES)." },
    ),
  );
}

function drawQueue(queue, queued) {
  const items = queued.items.slice().sort((x, y) => (x.queue_position ?? 1e12) - (y.queue_position ?? 1e12));
  keepFocus(queue, () => replace(
    queue,
    table(
      [{ label: "#", cls: "num" }, "Job", "Why it waits", "Labels", "Submitted"],
      items.map((j) =>
        h(
          "tr",
          {},
          h("td", { class: "num" }, j.queue_position ?? "…"),
          h("td", {}, link(`/jobs/${encodeURIComponent(j.id)}`, j.name), h("div", { class: "muted small mono" }, j.id)),
          h("td", { class: "reason" }, j.status_reason || ""),
          h("td", {}, labels(j.labels)),
          h("td", {}, when(j.created_at)),
        ),
      ),
      { empty: "No job is waiting: every submitted job has started." },
    ),
    queued.total > items.length ? h("p", { class: "muted small" }, `The ${items.length} newest of ${queued.total.toLocaleString()} queued jobs, in queue order. `, link("/?status=QUEUED", "All queued jobs")) : null,
  ));
}
