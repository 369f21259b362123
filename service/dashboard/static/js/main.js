// Entry point: the routes, the login form, the confirmation dialog and the page frame.

import { auth, AuthError, get } from "./api.js";
import { h, replace, errorNotice } from "./dom.js";
import { route, start, render, navigate, stop } from "./router.js";
import { setTitle } from "./frame.js";
import { jobsPage } from "./jobs.js";
import { jobPage } from "./job.js";
import { clusterPage } from "./cluster.js";
import { schedulesPage } from "./schedules.js";
import { pipelinesPage, pipelinePage } from "./pipelines.js";

const main = document.getElementById("main");
const signout = document.getElementById("signout");
const whoami = document.getElementById("whoami");
let shownFor = null; // the token whose user the header names

// "signed in as NAME", once per token (GET /v1/me); a failure leaves the header as it was.
async function showWho() {
  if (!auth.token || shownFor === auth.token) return;
  shownFor = auth.token;
  try {
    const me = await get("/me");
    whoami.textContent = `signed in as ${me.name}`;
    whoami.hidden = false;
  } catch {
    shownFor = null;
  }
}


function mark(nav) {
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

// Each page renders into <main>; an AuthError anywhere brings the login form.
function page(nav, fn) {
  return async (ctx) => {
    mark(nav);
    signout.hidden = !auth.token;
    if (!auth.token) whoami.hidden = true;
    if (auth.needsLogin()) return login();
    showWho();
    try {
      await fn(main, ctx);
    } catch (err) {
      if (ctx.signal.aborted) return;
      if (err instanceof AuthError) return login(auth.token ? "The server refused the saved token: enter it again." : "");
      replace(main, errorNotice(err));
    }
  };
}

window.addEventListener("raydock:unauthorized", () => {
  stop();
  login(auth.token ? "The server refused the saved token: enter it again." : "");
});

function login(message = "") {
  setTitle("Sign in");
  const input = h("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "current-password",
    required: true,
    "aria-describedby": "login-help",
  });
  const status = h("p", { class: "error", role: "alert", id: "login-error" }, message);
  const button = h("button", { type: "submit", class: "primary" }, "Sign in");
  const form = h(
    "form",
    {
      onsubmit: async (e) => {
        e.preventDefault();
        const token = input.value.trim();
        if (!token) return;
        button.disabled = true;
        status.textContent = "";
        auth.token = token;
        try {
          await get("/jobs?limit=1");
          render();
        } catch (err) {
          auth.token = null;
          status.textContent =
            err instanceof AuthError
              ? "That token was refused. Use your user token (raydock token create) or the server's RAYDOCK_API_TOKEN, exactly as given."
              : `Could not check the token: ${err.message}`;
          button.disabled = false;
          input.select();
        }
      },
    },
    h("label", { for: "token" }, "API token"),
    input,
    h(
      "p",
      { class: "muted small", id: "login-help" },
      "This server asks who you are: your user token (rdk_…) or its RAYDOCK_API_TOKEN. It is kept in this tab's session storage only, " +
        "sent as a bearer header, and forgotten when the tab closes.",
    ),
    status,
    button,
  );
  replace(main, h("section", { class: "panel login" }, h("h1", {}, "Sign in to raydock"), form));
  input.focus();
}

function notFound(el) {
  const path = location.pathname;
  setTitle("Not found");
  replace(el, h("div", { class: "notice" }, `No page at ${path}. `, h("a", { href: "/" }, "Go to the jobs.")));
}

signout.addEventListener("click", () => {
  auth.token = null;
  shownFor = null;
  whoami.hidden = true;
  navigate("/");
});

route("/", page("jobs", jobsPage));
route("/jobs", page("jobs", jobsPage));
route("/jobs/:id", page("jobs", jobPage));
route("/cluster", page("cluster", clusterPage));
route("/schedules", page("schedules", schedulesPage));
route("/pipelines", page("pipelines", pipelinesPage));
route("/pipelines/:id", page("pipelines", pipelinePage));
route("/.*", page(null, notFound));
start();
