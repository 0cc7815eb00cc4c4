/* Search results quote each page's text, taken from its HTML, where formulas are still TeX
   source (MathJax typesets them only on the page itself). Put "…" where a formula was, so a
   snippet never shows raw TeX. Sphinx's Search object is defined by searchtools.js; its
   summaries are made after the pages are fetched, long after DOMContentLoaded. */
document.addEventListener("DOMContentLoaded", () => {
  if (typeof Search === "undefined" || !Search.htmlToText) return;
  const htmlToText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(".math").forEach((el) => el.replaceWith("…"));
    return htmlToText(doc.documentElement.outerHTML, anchor);
  };
});
