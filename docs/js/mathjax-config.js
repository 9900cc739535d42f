// MathJax for pymdownx.arithmatex (generic mode); without network the TeX source shows.
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]],
         processEscapes: true, processEnvironments: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
};
document$.subscribe(() => { if (window.MathJax.typesetPromise) MathJax.typesetPromise(); });
