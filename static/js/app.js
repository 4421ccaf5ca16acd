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

// ---- bulk actions (issue 9, item 3; helper "bulk") ------------------------------------
// The inbox's bulk bar (templates/checkpoints/_bulk_bar.html) is a plain form that works
// without this; here: "select all on this page" (the header box, hidden without
// JavaScript) and the count of ticked runs next to "the runs ticked below". Delegated on
// document, so it keeps working after htmx swaps the inbox.
(function () {
  "use strict";

  function boxes() {
    return document.querySelectorAll('input[type=checkbox][name=run][form="bulk-form"]');
  }

  function refresh() {
    var all = boxes(), ticked = 0, i;
    for (i = 0; i < all.length; i++) { if (all[i].checked) { ticked++; } }
    var count = document.querySelector("[data-bulk-count]");
    if (count) { count.textContent = ticked ? "(" + ticked + " ticked)" : ""; }
    var page = document.querySelector("input[data-bulk-page]");
    if (page) {
      page.hidden = all.length === 0;
      page.checked = all.length > 0 && ticked === all.length;
      page.indeterminate = ticked > 0 && ticked < all.length;
    }
  }

  document.addEventListener("change", function (e) {
    var target = e.target;
    if (target.matches && target.matches("input[data-bulk-page]")) {
      var all = boxes(), i;
      for (i = 0; i < all.length; i++) { all[i].checked = target.checked; }
      refresh();
    } else if (target.matches && target.matches('input[name=run][form="bulk-form"]')) {
      refresh();
    }
  });
  document.addEventListener("DOMContentLoaded", refresh);
  document.addEventListener("htmx:afterSettle", refresh);
})();
// ---- end bulk actions ----------------------------------------------------------------
