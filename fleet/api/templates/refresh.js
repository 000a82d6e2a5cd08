// Live status: fetch this page again every few seconds and swap in its <main>, so figures change
// without a reload's flicker or a lost scroll position. A redirect (logged out, token revoked) or
// an error answer reloads the page to show it; a failed fetch (the API restarting) just tries again.
(function () {
  "use strict";
  var every = Number(document.body.dataset.refresh || 0) * 1000;
  if (!every) return;
  function tick() {
    fetch(location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (answer) {
        if (answer.redirected || !answer.ok) { location.reload(); return null; }
        return answer.text();
      })
      .then(function (html) {
        if (html === null) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        var shown = document.querySelector("main");
        if (fresh && shown) shown.replaceWith(fresh);
        setTimeout(tick, every);
      })
      .catch(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
