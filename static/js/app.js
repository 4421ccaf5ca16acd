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

// ---- Time and words for people (issue 9, item 5) -------------------------------------
// Times: the server renders <time datetime="…Z" title="… UTC">3 min ago</time>
// (templatetags/dashboard.py "when"); here each one also shows the time in the browser's
// zone, "3 min ago · 14:02:11" (with the date when it is not today), the zone named once
// in the page's footer (#tz-note), and its title gives the full local time with its UTC
// offset and zone, then the UTC time.
// Copy buttons: <button data-copy="value"> copies its value (Clipboard API; a hidden
// textarea and execCommand where that is refused, e.g. over plain http).
// Irreversible actions: a <form data-confirm="question"> asks in a dialog; the dialog
// replaces the form's "I understand" box, which a page without JavaScript shows instead
// (the server requires the box either way, so it is ticked once the dialog is accepted).
(function () {
  "use strict";

  var zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (err) { zone = ""; }

  function formatter(options) {
    try { return new Intl.DateTimeFormat(undefined, options); } catch (err) { return null; }
  }
  var clock = formatter({ hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
  var day = formatter({ year: "numeric", month: "short", day: "numeric" });
  var full = formatter({ year: "numeric", month: "short", day: "numeric", hour: "2-digit",
                         minute: "2-digit", second: "2-digit", hourCycle: "h23",
                         timeZoneName: "shortOffset" }) ||
             formatter({ year: "numeric", month: "short", day: "numeric", hour: "2-digit",
                         minute: "2-digit", second: "2-digit", hourCycle: "h23",
                         timeZoneName: "short" });

  function localise(el) {
    if (el.hasAttribute("data-local") || !clock || !day || !full) { return; }
    var at = new Date(el.getAttribute("datetime") || "");
    if (isNaN(at.getTime())) { return; }
    var utcTitle = el.getAttribute("title") || "";
    // Already an absolute UTC time, read in a browser that runs on UTC: nothing to add.
    if (/UTC/.test(el.textContent) && at.getTimezoneOffset() === 0) {
      el.setAttribute("data-local", el.textContent);
      return;
    }
    // "Today" is the server's (data-now, the database's clock), not this browser's,
    // whose clock may be off; a time without one falls back to the browser's.
    var now = new Date(el.getAttribute("data-now") || Date.now());
    if (isNaN(now.getTime())) { now = new Date(); }
    var sameDay = day.format(at) === day.format(now);
    // The zone is named once per page (the footer, "tzNote"); the title names it too.
    var local = (sameDay ? "" : day.format(at) + " ") + clock.format(at);
    var rel = document.createElement("span");
    rel.className = "rel";
    rel.textContent = el.textContent;
    var abs = document.createElement("span");
    abs.className = "abs";
    abs.textContent = " · " + local;
    el.replaceChildren(rel, abs);
    el.setAttribute("title", full.format(at) + (zone ? " (" + zone + ")" : "") +
                    (utcTitle ? " · " + utcTitle : ""));
    el.setAttribute("data-local", local);
  }

  // The relative words of a <time data-now> (templatetags/dashboard.py "when"), kept
  // true while the page stays open: its age is the server's time when it was drawn
  // (data-now, the database's clock) plus how long this page has shown it, so a
  // browser whose clock is off still says what the server would. The words are
  // selectors/nextstep.py "ago"'s, to the letter (tests/browser/test_ticking_times.py
  // holds the two to one table).
  var shownAt = new WeakMap();

  function agoWords(seconds) {
    // seconds: a number (fractions too); a time under a second ahead is "in 0 s".
    var future = seconds < 0, left = Math.floor(Math.abs(seconds)), text = "";
    var units = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
    for (var i = 0; i < units.length; i++) {
      if (left >= units[i][0] || units[i][1] === "s") {
        text = Math.floor(left / units[i][0]) + " " + units[i][1];
        break;
      }
    }
    return future ? "in " + text : text + " ago";
  }
  window.recoveryAgoWords = agoWords;

  function tick(el) {
    var now = Date.parse(el.getAttribute("data-now") || "");
    var at = Date.parse(el.getAttribute("datetime") || "");
    if (isNaN(now) || isNaN(at)) { return; }
    if (!shownAt.has(el)) { shownAt.set(el, Date.now()); return; }
    var words = agoWords((now + (Date.now() - shownAt.get(el)) - at) / 1000);
    var rel = el.querySelector(".rel");
    if (rel) {
      if (rel.textContent !== words) { rel.textContent = words; }
    } else if (!el.children.length && el.textContent !== words) {
      el.textContent = words;
    }
  }

  function tickAll() { document.querySelectorAll("time[data-now]").forEach(tick); }

  function confirmable(form) {
    if (form.hasAttribute("data-confirm-ready")) { return; }
    form.setAttribute("data-confirm-ready", "");
    var box = form.querySelector("input[type=checkbox][name=confirm]");
    if (box) {
      box.required = false;
      var label = box.closest("label");
      if (label) { label.hidden = true; }
    }
  }

  // "Times are in Asia/Tokyo (UTC+9)": the one statement of the page's time zone.
  function tzNote() {
    var note = document.getElementById("tz-note");
    if (!note || note.hasAttribute("data-zone") || !clock) { return; }
    var minutes = -new Date().getTimezoneOffset();
    var sign = minutes < 0 ? "-" : "+", abs = Math.abs(minutes);
    var offset = "UTC" + (minutes ? sign + Math.floor(abs / 60) + (abs % 60 ? ":" + String(abs % 60).padStart(2, "0") : "") : "");
    var where = !zone ? "your browser's time zone (" + offset + ")"
              : zone === offset ? zone : zone + " (" + offset + ")";
    note.textContent = "Times are in " + where + "; hover a time for its date, offset and UTC.";
    note.setAttribute("data-zone", zone);
  }

  function enhance(root) {
    if (!root || !root.querySelectorAll) { return; }
    tzNote();
    if (root.matches && root.matches("time[datetime]")) { localise(root); }
    root.querySelectorAll("time[datetime]").forEach(localise);
    if (root.matches && root.matches("time[data-now]")) { tick(root); }
    root.querySelectorAll("time[data-now]").forEach(tick);
    if (root.matches && root.matches("form[data-confirm]")) { confirmable(root); }
    root.querySelectorAll("form[data-confirm]").forEach(confirmable);
  }

  // htmx asks before sending: the question is the form's data-confirm.
  document.addEventListener("htmx:confirm", function (e) {
    var form = e.detail && e.detail.elt;
    if (!form || !form.matches || !form.matches("form[data-confirm]")) { return; }
    e.preventDefault();
    if (window.confirm(form.getAttribute("data-confirm"))) {
      var box = form.querySelector("input[type=checkbox][name=confirm]");
      if (box) { box.checked = true; }
      e.detail.issueRequest(true);
    }
  });

  function copied(button, ok) {
    var before = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", before);
    button.textContent = ok ? "copied" : "copy failed";
    button.classList.toggle("copy-done", ok);
    window.setTimeout(function () {
      button.textContent = before;
      button.classList.remove("copy-done");
    }, 1500);
  }

  function copyByHand(text) {
    var scratch = document.createElement("textarea");
    scratch.value = text;
    scratch.setAttribute("readonly", "");
    scratch.className = "copy-scratch";
    document.body.append(scratch);
    scratch.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (err) { ok = false; }
    scratch.remove();
    return ok;
  }

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button[data-copy]");
    if (!button) { return; }
    e.preventDefault();
    var text = button.getAttribute("data-copy");
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { copied(button, true); },
                                               function () { copied(button, copyByHand(text)); });
    } else {
      copied(button, copyByHand(text));
    }
  });

  window.setInterval(tickAll, 10000);
  document.addEventListener("htmx:load", function (e) { enhance(e.target); });
  document.addEventListener("htmx:afterSettle", function () { enhance(document); });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { enhance(document); });
  } else {
    enhance(document);
  }
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

  // Mark unknown and close need the confirm box (the server refuses them without it):
  // the browser asks for it before sending, so a forgotten tick loses nothing typed.
  function confirmNeeded() {
    var form = document.getElementById("bulk-form");
    if (!form) { return; }
    var action = form.querySelector("select[name=action]");
    var box = form.querySelector("input[name=confirm]");
    if (!action || !box) { return; }
    var needs = (action.getAttribute("data-confirm-actions") || "").split(" ");
    box.required = needs.indexOf(action.value) !== -1;
  }

  document.addEventListener("change", function (e) {
    var target = e.target;
    if (target.matches && target.matches('#bulk-form select[name=action]')) {
      confirmNeeded();
    } else if (target.matches && target.matches("input[data-bulk-page]")) {
      var all = boxes(), i;
      for (i = 0; i < all.length; i++) { all[i].checked = target.checked; }
      refresh();
    } else if (target.matches && target.matches('input[name=run][form="bulk-form"]')) {
      refresh();
    }
  });
  document.addEventListener("DOMContentLoaded", function () { refresh(); confirmNeeded(); });
  document.addEventListener("htmx:afterSettle", function () { refresh(); confirmNeeded(); });
})();
// ---- end bulk actions ----------------------------------------------------------------

// ---- Pages that move by themselves (issue 21, item 8) --------------------------------
// A polled fragment ([data-live-poll], dashboard/live.py) swaps a fresh copy of what
// changed over the page. Never under someone typing: when the swap would replace a form
// field holding text (or the focused one), it is not made; the poll stops and says
// "changed: reload" instead, so a reason being typed is never lost.
(function () {
  "use strict";

  function typing(target) {
    if (!target) { return false; }
    var fields = target.querySelectorAll("input[type=text], input:not([type]), textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value || fields[i] === document.activeElement) { return true; }
    }
    return false;
  }

  document.addEventListener("htmx:beforeSwap", function (e) {
    var poller = e.detail.requestConfig && e.detail.requestConfig.elt;
    if (!poller || !poller.hasAttribute || !poller.hasAttribute("data-live-poll")) { return; }
    if (e.detail.xhr.status !== 200 || !typing(e.detail.target)) { return; }
    e.detail.shouldSwap = false;
    var note = document.createElement("p");
    note.className = poller.className + " live-changed";
    note.id = poller.id;
    var link = document.createElement("a");
    link.href = window.location.pathname;
    link.textContent = "reload";
    note.append("This changed while you were typing: ", link, " to see it.");
    poller.replaceWith(note);  // out of the page: htmx stops its poll
  });
})();
