// Loom dashboard: the little the pages need beyond plain HTML (each works without it).
// - [data-autosubmit]: a select that submits its form on change (the namespace picker).
// - form[data-live]: a search that narrows as the user types, swapping the results in.
// - form[data-confirm]: asks before a destructive post.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("[data-autosubmit]")) {
    el.addEventListener("change", () => el.form.submit());
  }
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
  for (const form of document.querySelectorAll("form[data-live]")) liveSearch(form);
});

function liveSearch(form) {
  const target = document.getElementById(form.dataset.target);
  let timer = null;
  let asked = 0;
  const run = async () => {
    const mine = ++asked;
    const query = new URLSearchParams(new FormData(form));
    const answer = await fetch(`${form.dataset.live}?${query}`, { credentials: "same-origin" });
    if (mine !== asked) return; // a later keystroke's answer wins
    target.innerHTML = await answer.text();
    target.dataset.query = query.get("q") || "";
    history.replaceState(null, "", `${form.action}?${query}`);
  };
  form.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(run, 200);
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    clearTimeout(timer);
    run();
  });
}
