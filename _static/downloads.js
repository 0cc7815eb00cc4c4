// Every download link of the site saves a file, served or opened from disk.
//
// * The theme's ".ipynb" and ".md" buttons open their file in a new tab: they get the
//   `download` attribute (named after the file) instead, as the {download} links have.
// * Opened from disk (file://), Chromium ignores `download` and shows a text file (.ipynb,
//   .txt, .lock, .md) instead of saving it, and a page may not read a file. The build writes
//   next to every download `<file>.js` (scripts/book_ext.py, offline_copy), a script that
//   calls courseSaveFile(name, base64 bytes); a click loads it and saves the bytes from a
//   data: URL, which browsers download under the given name.
(function () {
  "use strict";
  var SELECTOR = "a.download, a.btn-download-notebook-button, a.btn-download-source-button";

  function fileName(link) {
    return decodeURIComponent(link.pathname.split("/").pop());
  }

  window.courseSaveFile = function (name, base64) {
    var link = document.createElement("a");
    link.href = "data:application/octet-stream;base64," + base64;
    link.download = name;
    link.style.display = "none";
    document.body.appendChild(link);
    link.click();
    link.remove();
  };

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(SELECTOR).forEach(function (link) {
      link.setAttribute("download", fileName(link));
      link.removeAttribute("target");
    });
  });

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest(SELECTOR);
    if (!link || window.location.protocol !== "file:") {
      return;
    }
    event.preventDefault();
    var script = document.createElement("script");
    script.src = link.href + ".js";
    script.onload = script.onerror = function () { script.remove(); };
    document.head.appendChild(script);
  });
})();
