// harvest console: live refresh of an open run. No framework, no innerHTML: the page is
// server-rendered and escaped; this script only reads a JSON state and sets textContent.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-live");
  if (!url) { return; }
  var indicator = document.getElementById("live");
  var version = body.getAttribute("data-version");
  var failures = 0;

  function dirty() {
    // never reload over what an operator is typing
    var active = document.activeElement;
    if (active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA" || active.tagName === "SELECT")) {
      return true;
    }
    var fields = document.querySelectorAll("form.action input[type=text], form.action input[type=number], form.action textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) { return true; }
    }
    return false;
  }

  function say(text, stale) {
    if (!indicator) { return; }
    indicator.textContent = text;
    indicator.className = stale ? "live stale" : "live";
  }

  function poll() {
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}, cache: "no-store"})
      .then(function (response) {
        if (!response.ok) { throw new Error(String(response.status)); }
        return response.json();
      })
      .then(function (state) {
        failures = 0;
        if (version === null) { version = state.version; }
        if (state.version !== version) {
          if (dirty()) {
            say("changed: reload to see it", true);
          } else {
            window.location.reload();
            return;
          }
        } else {
          say("live · " + new Date().toLocaleTimeString(), false);
        }
        window.setTimeout(poll, 2000);
      })
      .catch(function () {
        failures += 1;
        say("not updating (" + failures + ")", true);
        window.setTimeout(poll, Math.min(30000, 2000 * failures));
      });
  }
  poll();
})();
