// The only module that talks to the API: every call goes to /v1 with the bearer token the
// user typed (kept in sessionStorage, never in a URL or a cookie). A 401 raises AuthError,
// which main.js answers with the login form.

const KEY = "raydock.token";

export class AuthError extends Error {}
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const auth = {
  required: document.querySelector('meta[name="raydock-auth"]')?.content === "token",
  get token() {
    return sessionStorage.getItem(KEY);
  },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
  // True when the page must ask for a token before any call.
  needsLogin() {
    return this.required && !this.token;
  },
};

function headers(extra = {}) {
  const h = { ...extra };
  if (auth.token) h.Authorization = `Bearer ${auth.token}`;
  return h;
}

async function refusal(response) {
  let code = "http_" + response.status;
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) ({ code, message } = body.error);
  } catch {
    /* not a raydock error body */
  }
  if (response.status === 401) return new AuthError(message);
  return new ApiError(response.status, code, message);
}

export async function request(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch("/v1" + path, init);
  if (!response.ok) throw await refusal(response);
  if (response.status === 204) return null;
  return response.json();
}

export const get = (path, signal) => request(path, { signal });
export const post = (path, body) => request(path, { method: "POST", body });
export const del = (path) => request(path, { method: "DELETE" });

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    for (const item of Array.isArray(v) ? v : [v]) q.append(k, item);
  }
  const s = q.toString();
  return s ? "?" + s : "";
}

// Read a response body as it arrives, calling onText with each decoded piece.
async function pump(path, signal, onText) {
  const response = await fetch("/v1" + path, { headers: headers(), signal });
  if (!response.ok) throw await refusal(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    onText(value);
  }
}

// Server-sent events over fetch (EventSource cannot send an Authorization header).
export async function streamEvents(path, signal, onEvent) {
  let buffer = "";
  let event = { type: "message", data: "" };
  await pump(path, signal, (text) => {
    buffer += text;
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl).replace(/\r$/, "");
      buffer = buffer.slice(nl + 1);
      if (line === "") {
        if (event.data) onEvent(event.type, JSON.parse(event.data.replace(/\n$/, "")));
        event = { type: "message", data: "" };
      } else if (line.startsWith("event:")) event.type = line.slice(6).trim();
      else if (line.startsWith("data:")) event.data += line.slice(5).replace(/^ /, "") + "\n";
      // id: and comments (": ping") need nothing here
    }
  });
}

// The job's log as text pieces, following until the job ends.
export function followLog(jobId, signal, onText) {
  return pump(`/jobs/${encodeURIComponent(jobId)}/logs?follow=true`, signal, onText);
}

// A download with the bearer header: fetch it whole as a blob, then hand it to the browser.
export async function download(path, filename) {
  const response = await fetch("/v1" + path, { headers: headers() });
  if (!response.ok) throw await refusal(response);
  const url = URL.createObjectURL(await response.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
