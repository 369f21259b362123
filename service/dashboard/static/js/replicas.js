// The server's replicas (server admins only): each one's id and host, when it started and
// was last seen, and the background units it runs with how long it has held each lease.
// Times are the database's clock, shown as ages against its "now" (no browser clock skew).

import { get, ApiError } from "./api.js";
import { h, replace, table, duration } from "./dom.js";

function ago(now, t) {
  return h("time", { datetime: new Date(t * 1000).toISOString(), title: new Date(t * 1000).toISOString() }, `${duration(now - t)} ago`);
}

// Whether the caller is a server admin (GET /v1/me): only they may list the replicas, and
// others are not sent to be refused.
export function isAdmin(signal) {
  return get("/me", signal).then((me) => me.admin, () => false);
}

// Resolves to the panel's content, or null when the caller may not list replicas.
export async function loadReplicas(signal, admin) {
  if (!(await admin)) return null;
  let r;
  try {
    r = await get("/replicas", signal);
  } catch (err) {
    if (err instanceof ApiError && err.status === 403) return null;
    throw err;
  }
  const since = Object.fromEntries(r.leases.filter((l) => l.holder && l.expires_in_s > 0).map((l) => [l.name, l.since]));
  const free = r.leases.filter((l) => !l.holder || l.expires_in_s <= 0).map((l) => l.name);
  return [
    table(
      ["Replica", "Host", "Started", "Last seen", "Runs (lease held for)"],
      r.replicas.map((x) => {
        const stale = r.now - x.seen_at > r.lease_ttl_s;
        return h(
          "tr",
          { "data-replica": x.id },
          h("td", { class: "mono small", title: x.id }, x.id),
          h("td", { class: "mono" }, x.id.split("/")[0]),
          h("td", {}, ago(r.now, x.started_at)),
          h("td", {}, ago(r.now, x.seen_at), stale ? [" ", h("span", { class: "badge s-FAILED" }, "gone")] : null),
          h(
            "td",
            { class: "leases" },
            x.leases.length
              ? x.leases.map((name) => h("div", { "data-lease": name }, h("span", { class: "mono" }, name), h("span", { class: "muted small" }, ` ${duration(r.now - since[name])}`)))
              : h("span", { class: "muted" }, stale ? "none" : "standby"),
          ),
        );
      }),
      { empty: "No replica has claimed its leases yet." },
    ),
    h(
      "p",
      { class: "muted small" },
      `A lease lasts ${duration(r.lease_ttl_s)} unrenewed: a replica gone that long leaves its units to another. `,
      free.length ? `Held by none now: ${free.join(", ")}.` : "Every unit is held.",
    ),
  ];
}
