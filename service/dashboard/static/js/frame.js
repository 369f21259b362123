// What every page shares beside the DOM helpers: the title, the confirmation dialog, and
// the way a failed background call is reported (a refused token brings the login form).

import { AuthError } from "./api.js";

export function setTitle(...parts) {
  document.title = [...parts, "raydock"].filter(Boolean).join(" · ");
}

export function handleError(err) {
  if (err?.name === "AbortError") return;
  if (err instanceof AuthError) window.dispatchEvent(new CustomEvent("raydock:unauthorized"));
  else setStatus(err.message || String(err), true);
}

// One line in the page header for what happened in the background (a refresh that failed).
export function setStatus(text, isError = false) {
  const el = document.getElementById("live");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

const dialog = document.getElementById("confirm");

// A modal yes/no; resolves true when the user confirms. Esc or "Keep it" cancel.
export function confirmAction(title, text, okLabel) {
  dialog.querySelector("#confirm-title").textContent = title;
  dialog.querySelector("#confirm-text").textContent = text;
  dialog.querySelector("#confirm-ok").textContent = okLabel;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}
