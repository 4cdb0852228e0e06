// Times are rendered by the server as <time datetime="ISO">... UTC</time>; show them in the
// operator's browser time zone and keep the UTC text as a tooltip.
(function () {
  "use strict";
  var format = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
    hour12: false, timeZoneName: "short",
  });

  function localize(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when.getTime())) return;
      if (!el.dataset.utc) {
        el.dataset.utc = el.textContent.trim();
        el.title = el.dataset.utc;
      }
      el.textContent = format.format(when);
    });
  }

  window.FabricPool = window.FabricPool || {};
  window.FabricPool.localizeTimes = localize;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { localize(document); });
  } else {
    localize(document);
  }
})();
