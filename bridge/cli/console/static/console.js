// The operator token is typed once per tab (kept in sessionStorage, never in a cookie) and
// copied into each write form's token field; "select all" boxes; bars drawn from data-width
// (inline styles are refused by the content security policy).
(function () {
  "use strict";
  var KEY = "bridge-console-token";
  var input = document.getElementById("operator-token");
  function fill() {
    var token = sessionStorage.getItem(KEY) || "";
    document.querySelectorAll("input.token-field").forEach(function (f) { f.value = token; });
  }
  if (input) {
    input.value = sessionStorage.getItem(KEY) || "";
    input.addEventListener("input", function () { sessionStorage.setItem(KEY, input.value); fill(); });
  }
  fill();
  document.querySelectorAll("input.select-all").forEach(function (box) {
    box.addEventListener("change", function () {
      box.closest("form").querySelectorAll("input[type=checkbox]").forEach(function (c) { c.checked = box.checked; });
    });
  });
  document.querySelectorAll(".bar").forEach(function (bar) {
    bar.style.width = (bar.getAttribute("data-width") || "0") + "px";
  });
})();
