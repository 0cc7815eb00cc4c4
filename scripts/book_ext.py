"""A small Sphinx extension for the course site (loaded from ``_config.yml``).

1. An ``.ipynb`` download button on chapter pages. sphinx-book-theme offers the notebook of a
   MyST markdown chapter only when a launch button (Binder, JupyterHub, ...) is configured, and
   the course has none because the site is read offline. MyST-NB 1.4 also writes
   ``_build/jupyter_execute/<page>.ipynb`` *without* the outputs when they come from the
   execution cache. So this extension merges the cached outputs into that notebook, puts it
   next to the page's source under ``_sources/`` and tells the theme, which then lists
   ``.ipynb`` beside ``.md`` in the download menu.
2. Offline, accessible labs. matplotlib's ``to_jshtml`` animations link Font Awesome 4.4 from a
   public CDN for their button icons; the theme already serves Font Awesome from ``_static``,
   so that ``<link>`` is dropped from every page. Their frame ``<img>`` has no alt text; where
   the chapter did not add one, it gets a sentence that says how to use the lab.
3. No Thebe. Jupyter Book always loads sphinx-thebe, whose (unused: the site has no launch
   buttons) configuration script is added twice per page in this stack, which is a JavaScript
   error ("THEBE_JS_URL has already been declared") on every page. Its event handlers and
   stylesheet are removed, so pages carry no Thebe code and no reference to its CDN.
"""

import re
from pathlib import Path

import nbformat
from jupyter_cache import get_cache

CDN_FONT_AWESOME = re.compile(
    r'<link\s+rel="stylesheet"\s+href="https://maxcdn\.bootstrapcdn\.com/font-awesome/[^"]*">\s*'
)


def executed_notebook(app, pagename):
    """The page's notebook with outputs (from the execution cache), or None for a plain page."""
    source = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not source.is_file():
        return None
    notebook = nbformat.read(source, as_version=4)
    if any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"):
        return notebook
    cache_path = app.env.mystnb_config.execution_cache_path
    cache_path = cache_path or Path(app.outdir).parent / ".jupyter_cache"
    try:
        _, notebook = get_cache(cache_path).merge_match_into_notebook(notebook)
    except KeyError:  # not executed (excluded from execution): offer it as it is
        pass
    return notebook


def add_ipynb_download(app, pagename, templatename, context, doctree):
    """``html-page-context`` handler; runs before the theme builds its buttons (priority 501)."""
    if doctree is None or not context.get("sourcename", "").endswith((".md", ".md.txt")):
        return
    notebook = executed_notebook(app, pagename)
    if notebook is None:
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


ANIMATION_FRAME_WITHOUT_ALT = re.compile(r'<img id="_anim_img(\w+)">')
ANIMATION_ALT = ("Current frame of an animated figure: the slider and the buttons below it "
                 "step through the frames")


def fix_animations(app, pagename, templatename, context, doctree):
    """Make ``to_jshtml`` labs offline (no CDN stylesheet) and give their frames alt text."""
    if "body" in context:
        body = CDN_FONT_AWESOME.sub("", context["body"])
        context["body"] = ANIMATION_FRAME_WITHOUT_ALT.sub(
            rf'<img id="_anim_img\1" alt="{ANIMATION_ALT}">', body)


def disable_thebe(app):
    """Disconnect sphinx-thebe's handlers and drop its stylesheet (it was set up before us)."""
    for listeners in app.events.listeners.values():
        for listener in list(listeners):
            if getattr(listener.handler, "__module__", "").startswith("sphinx_thebe"):
                app.disconnect(listener.id)
    app.registry.css_files = [(name, attrs) for name, attrs in app.registry.css_files
                              if "thebe" not in (name or "")]


def setup(app):
    disable_thebe(app)
    app.connect("html-page-context", add_ipynb_download, priority=400)
    app.connect("html-page-context", fix_animations, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
