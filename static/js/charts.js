// What every plotly page shares. Plotly reads hover and label text as markup, so every
// name from the database goes through esc(); note() replaces a chart with a sentence.
window.FabricPoolCharts = (function () {
  "use strict";
  function esc(text) {
    return String(text == null ? "" : text)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&#34;").replace(/'/g, "&#39;");
  }
  function note(el, text) {
    el.textContent = "";
    var p = document.createElement("p");
    p.className = "muted chart-note";
    p.textContent = text;
    el.appendChild(p);
  }
  return { esc: esc, note: note };
})();
