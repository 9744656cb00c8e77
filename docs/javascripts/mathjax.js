// MathJax's configuration, read by the MathJax script that follows it (mkdocs.yml extra_javascript).
// pymdownx.arithmatex (generic mode) wraps each formula of the Markdown in <span class="arithmatex">\( ... \)</span>
// or <div class="arithmatex">\[ ... \]</div>; MathJax typesets only those, never the rest of the page.
// The script and its fonts are served from the site itself (scripts/docs_hooks.py copies them from the
// django-static-mathjax package at build time): the site renders its maths offline.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};
