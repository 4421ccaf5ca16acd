// The dashboard's only script besides htmx (served from /static/, so the
// Content-Security-Policy needs no 'unsafe-inline'). Keep behaviour out of templates:
// no inline <script>, no on* attributes, no style attributes.
(function () {
  "use strict";

  function flash(text) {
    var area = document.getElementById("flash");
    if (!area) { return; }
    var box = document.createElement("div");
    box.className = "flash flash-error";
    box.textContent = text;
    area.replaceChildren(box);
  }

  // Server errors htmx does not swap (5xx, network): say so instead of failing silently.
  document.addEventListener("htmx:responseError", function (e) {
    flash("The server answered " + e.detail.xhr.status + ". Reload the page and try again.");
  });
  document.addEventListener("htmx:sendError", function () {
    flash("The server could not be reached.");
  });
})();
