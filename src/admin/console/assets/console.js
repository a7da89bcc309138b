// idemproxy console: refreshes the overview's figures from /console/overview.json every
// 5 s. Everything else is plain HTML and works without this script.
"use strict";
(function () {
  if (!document.querySelector("[data-figure]")) return;
  function figure(v, unit) {
    if (v === null || v === undefined) return "\u2014";
    return (Number.isInteger(v) ? String(v) : v.toFixed(1)) + (unit || "");
  }
  function set(name, text) {
    var el = document.querySelector('[data-figure="' + name + '"]');
    if (el) el.textContent = text;
  }
  function errors(rows) {
    var body = document.querySelector('[data-figure="errors"]');
    if (!body) return;
    while (body.firstChild) body.removeChild(body.firstChild);
    if (rows.length === 0) rows = [{ kind: "None.", last_minute: "", total: "" }];
    rows.forEach(function (e) {
      var tr = document.createElement("tr");
      [e.kind, e.last_minute, e.total].forEach(function (v) {
        var td = document.createElement("td");
        td.textContent = String(v);
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }
  function refresh() {
    fetch("/console/overview.json", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); throw new Error("signed out"); }
        return r.json();
      })
      .then(function (f) {
        set("window_seconds", String(f.window_seconds));
        set("in_flight", figure(f.in_flight));
        set("unresolved", f.unresolved === null ? "store unavailable" : String(f.unresolved));
        set("executed_per_minute", figure(f.executed_per_minute));
        set("replayed_per_minute", figure(f.replayed_per_minute));
        set("store_p99_ms", figure(f.store_p99_ms, " ms"));
        set("store_mean_ms", figure(f.store_mean_ms, " ms"));
        set("connections", figure(f.connections));
        errors(f.errors);
      })
      .catch(function () {});
  }
  setInterval(refresh, 5000);
})();
