// Client-side routes (the last one registered should match any path) on the History API: links stay real <a href> (keyboard, new tab, reload),
// and the server answers index.html for any page path, so a deep link survives a reload.

const routes = [];
let current = null; // { controller } of the page on screen: aborted when another replaces it

export function route(pattern, render) {
  const names = [];
  const regex = new RegExp(
    "^" + pattern.replace(/:([a-z]+)/g, (_, name) => (names.push(name), "([^/]+)")) + "/?$",
  );
  routes.push({ regex, names, render });
}

export function navigate(path, { replace = false } = {}) {
  if (replace) history.replaceState(null, "", path);
  else history.pushState(null, "", path);
  return render();
}

// Stop the page on screen (its refreshes and streams), e.g. when the login form replaces it.
export function stop() {
  current?.controller.abort();
}

export async function render() {
  const path = location.pathname;
  current?.controller.abort();
  const controller = new AbortController();
  current = { controller };
  for (const r of routes) {
    const m = r.regex.exec(path);
    if (!m) continue;
    const params = Object.fromEntries(r.names.map((n, i) => [n, decodeURIComponent(m[i + 1])]));
    const search = new URLSearchParams(location.search);
    return r.render({ params, search, signal: controller.signal });
  }
}

export function start() {
  document.addEventListener("click", (e) => {
    const a = e.target.closest("a[href]");
    if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    const url = new URL(a.href, location.href);
    if (url.origin !== location.origin || a.target || a.hasAttribute("download")) return;
    if (/^\/(v1|docs|redoc|openapi\.json|healthz|livez|ui)(\/|$)/.test(url.pathname)) return;
    e.preventDefault();
    navigate(url.pathname + url.search);
  });
  window.addEventListener("popstate", render);
  return render();
}

// Repeat fn every ms while the page is on screen (stops when signal aborts); a slow call is
// never overlapped by the next.
export function every(ms, signal, fn) {
  let busy = false;
  const id = setInterval(async () => {
    if (document.hidden || busy) return;
    busy = true;
    try {
      await fn();
    } finally {
      busy = false;
    }
  }, ms);
  signal.addEventListener("abort", () => clearInterval(id));
}
