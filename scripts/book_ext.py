"""A small Sphinx extension for the course site (loaded from ``_config.yml``).

1. An ``.ipynb`` download button on chapter pages, which saves the chapter as a notebook that
   reads and runs like the page in JupyterLab and the classic Notebook
   (``scripts/chapter_notebook.py``), named ``<chapter>-chapter.ipynb`` so that it never has
   the name of an exercise notebook. sphinx-book-theme offers the notebook of a MyST markdown
   chapter only when a launch button (Binder, JupyterHub, ...) is configured, and the course
   has none because the site is read offline; MyST-NB 1.4 also writes
   ``_build/jupyter_execute/<page>.ipynb`` *without* the outputs when they come from the
   execution cache. So this extension merges the cached outputs into that notebook, converts
   it with what Sphinx knows (glued values, figure and equation numbers, titles, the
   bibliography), puts it next to the page's source under ``_sources/`` and tells the theme,
   which then lists ``.ipynb`` beside ``.md`` in the download menu. Every download (that
   notebook, the page sources, the ``{download}`` files) also gets ``<file>.js``, its bytes in
   a script, so that ``_static/downloads.js`` can save it from a site opened from disk, where
   browsers ignore the ``download`` attribute of links to text files.
2. No Thebe. Jupyter Book always loads sphinx-thebe, whose (unused: the site has no launch
   buttons) configuration script is added twice per page in this stack, which is a JavaScript
   error ("THEBE_JS_URL has already been declared") on every page. Its event handlers and
   stylesheet are removed, so pages carry no Thebe code and no reference to its CDN.
3. Chapters execute two at a time. With ``execute_notebooks: cache`` MyST-NB runs each chapter
   when Sphinx reads it, one after another. Before Sphinx reads anything, this extension finds
   the notebooks it is about to read whose code is not in the execution cache, runs them in a
   pool of ``BOOK_EXECUTION_JOBS`` processes (default 2; 1 turns this off) and stores each
   success in the cache exactly as MyST-NB would, so Sphinx then finds every chapter cached.
   The notebooks are read with MyST-NB's own reader and configuration, so the cache key is the
   one MyST-NB computes: a changed chapter re-executes, an unchanged one does not. A chapter
   that fails is not cached; Sphinx runs it again itself and reports the failing cell (warning,
   traceback, ``reports/<page>.err.log``) as it always did. The pool's kernels start with one
   line run before the first cell (:data:`KERNEL_ARGUMENTS`): a module no chapter uses is
   marked absent, which saves each kernel 1.4 s of import.
4. Accessible generated HTML. docutils marks bibliography entries with the DPUB-ARIA role
   ``doc-biblioentry``, deprecated since DPUB-ARIA 1.1, inside a ``role="list"`` that then
   has no ``listitem`` children (axe-core: aria-deprecated-role, aria-required-children);
   they become list items. MyST-NB names its "Show code cell source" toggles "Toggle hidden
   content", a name that leaves out the visible text (label-content-name-mismatch); the
   visible text names them instead. The bibliography's pybtex style (author–year labels, a
   link on every entry) is ``scripts/bib_style.py``, registered here.
5. The API reference (``api.md``) documents each name once. Both backends re-export the
   functions of ``transformer_ref.counts``; autodoc would list them under each backend as well
   as under ``counts``, so they are skipped in the backend sections.
6. Values from the lock files. The grader's versions reach the pages as MyST
   substitutions (``{{ grader_python }}``, ``{{ grader_numpy }}``, ``{{ grader_torch }}``,
   ``{{ grader_triton }}``, ``{{ wheel }}``) computed from the lock files by
   ``scripts.environment``, never typed by hand. The top-level ``launch_buttons`` and
   ``repository`` keys of ``_config.yml`` reach the theme (Jupyter Book would drop them,
   because ``html_theme_options`` is given in full under ``sphinx: config:``).
"""

import json
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path, PurePosixPath
from tempfile import TemporaryDirectory

import nbformat
import yaml
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.cache.db import NbProjectRecord
from jupyter_cache.executors.utils import single_nb_execution
from myst_nb.core.nb_to_tokens import nb_node_to_dict
from myst_nb.core.read import create_nb_reader
from sphinx.util import logging

from scripts import bib_style, chapter_notebook

LOGGER = logging.getLogger(__name__)
JOBS_VARIABLE = "BOOK_EXECUTION_JOBS"
# Each chapter sets torch to one thread; with two kernels on two cores, BLAS and OpenMP
# pools must not add threads of their own either.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
# Run by each chapter's kernel before its first cell: ``from myst_nb import glue`` imports
# nbformat and so jsonschema, which builds rfc3987_syntax's grammar at import (1.4 s of every
# chapter's kernel) only to check "iri" string formats, which no chapter uses. No name is
# added to the chapter's namespace.
KERNEL_ARGUMENTS = ["--IPKernelApp.exec_lines=__import__('sys').modules['rfc3987_syntax'] = None"]

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


def chapter_book(app, pagename, notebook):
    """What Sphinx knows that chapter ``pagename`` refers to, as a :class:`chapter_notebook.Book`."""
    env, config = app.env, app.config
    numbers = env.toc_fignumbers

    def shown(docname, kind, node_id):
        number = numbers.get(docname, {}).get(kind, {}).get(node_id)
        return ".".join(map(str, number)) if number else None

    labels = env.domaindata["std"]["labels"]
    figures = {label: shown(docname, "figure", node_id)
               for label, (docname, node_id, _) in labels.items()}
    equations = {label: shown(docname, "displaymath", f"equation-{label}") or str(number)
                 for label, (docname, number) in env.domaindata["math"]["objects"].items()}
    terms = {name: anchor for (kind, name), (_, anchor) in
             env.domaindata["std"]["objects"].items() if kind == "term"}
    folder = Path(env.doc2path(pagename)).parent

    def include(path, options):
        from sphinx.directives.code import LiteralIncludeReader

        return LiteralIncludeReader(str((folder / path).resolve()), options, config).read()[0]

    return chapter_notebook.Book(
        docname=pagename, title=env.titles[pagename].astext(),
        glue=chapter_notebook.glued_values(notebook),
        figures={label: number for label, number in figures.items() if number},
        equations=equations, terms=terms,
        labels={label: (docname, node_id, title) for label, (docname, node_id, title)
                in labels.items()},
        titles={docname: title.astext() for docname, title in env.titles.items()},
        citations=bibliography(app), base_url=config.html_baseurl or "",
        figure_format=config.numfig_format.get("figure", "Fig. %s"),
        equation_format=config.math_eqref_format or "Eq. {number}", include=include)


def bibliography(app):
    """key -> (label, Markdown text) of every entry of the book's ``.bib`` files, in the
    bibliography's order and with its labels ("Touvron et al., 2023a"); made once a build."""
    if getattr(app, "_course_bibliography", None) is None:
        from pybtex.backends.markdown import Backend
        from pybtex.database import parse_file

        markdown = Backend()
        entries = {}
        for name in app.config.bibtex_bibfiles:
            data = parse_file(str(Path(app.srcdir) / name))
            for entry in bib_style.CourseStyle().format_bibliography(data).entries:
                text = " ".join(entry.text.render(markdown).split("\n"))
                entries[entry.key] = (entry.label, text)
        app._course_bibliography = entries
    return app._course_bibliography


def download_path(pagename):
    """``chapters/01-rope`` -> ``chapters/01-rope-chapter.ipynb`` (under ``_sources``)."""
    return f"{pagename.rsplit('/', 1)[0]}/{chapter_notebook.download_name(pagename)}"


def add_ipynb_download(app, pagename, _templatename, context, doctree):
    """``html-page-context`` handler; runs before the theme builds its buttons (priority 400).

    Chapters only: ``run-yourself.md`` also executes (its commands are computed), but with
    the course's own code, which a reader who downloaded it would not have.
    """
    if (doctree is None or not pagename.startswith("chapters/")
            or not context.get("sourcename", "").endswith((".md", ".md.txt"))):
        return
    if executed_notebook(app, pagename) is not None:
        context["ipynb_source"] = download_path(pagename)


def point_button_at_download(app, pagename, _templatename, context, doctree):
    """``html-page-context``, after the theme (601): its notebook button names our file even
    where a launch button made the theme copy MyST-NB's notebook under the page's own name."""
    if doctree is None or not context.get("ipynb_source"):
        return
    if not pagename.startswith("chapters/"):
        return
    url = f"{context['pathto']('_sources', 1)}/{download_path(pagename)}"

    def visit(buttons):
        for button in buttons:
            if button.get("label") == "download-notebook-button":
                button["url"] = url
            visit(button.get("buttons", []))

    visit(context.get("header_buttons", []))


def write_ipynb_download(app, pagename, _templatename, context, doctree):
    """``html-page-context`` (900): write the chapter's download (``scripts/chapter_notebook.py``)."""
    if doctree is None or not pagename.startswith("chapters/") or not context.get("ipynb_source"):
        return
    notebook = executed_notebook(app, pagename)
    if notebook is None:
        return
    start = time.perf_counter()
    target = Path(app.outdir) / "_sources" / download_path(pagename)
    target.parent.mkdir(parents=True, exist_ok=True)
    md = getattr(app, "_course_markdown", None)
    if md is None:
        md = app._course_markdown = chapter_notebook.markdown_parser(app.env.myst_config)
    try:
        download = chapter_notebook.learner_notebook(notebook, chapter_book(app, pagename, notebook),
                                                     md)
    except chapter_notebook.ConversionError as exc:
        LOGGER.warning(f"{pagename}: its download notebook: {exc}", location=pagename)
        return
    nbformat.write(download, target)
    offline_copy(target)
    stale = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"  # the name before the suffix
    stale.unlink(missing_ok=True)
    app._course_download_seconds = (getattr(app, "_course_download_seconds", 0.0)
                                    + time.perf_counter() - start)


# A download link of the site opened from disk (file://): Chromium ignores ``download`` there
# and shows a text file (.ipynb, .txt, .lock, .md) instead of saving it. _static/downloads.js
# then loads ``<file>.js``, which hands it the file's bytes, and saves them from a data: URL.
OFFLINE_SUFFIX = ".js"
# Chromium's longest URL (2 MiB); a data: URL of a larger file would save nothing.
DATA_URL_LIMIT = 2 * 1024 * 1024 - 64


def offline_copy(path):
    """Write ``<path>.js``: a script that passes the file's name and bytes to downloads.js."""
    import base64

    payload = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    if len(payload) > DATA_URL_LIMIT:
        LOGGER.warning(f"{Path(path).name}: {len(payload):,} characters as a data: URL, more "
                       f"than browsers take ({DATA_URL_LIMIT:,}): it could not be saved from a "
                       "site opened from disk (make the file smaller)")
    Path(f"{path}{OFFLINE_SUFFIX}").write_text(
        f"window.courseSaveFile({json.dumps(Path(path).name)}, {json.dumps(payload)});\n",
        encoding="ascii")


def offline_downloads(app, exception):
    """``build-finished``: an offline copy of every ``{download}`` file and page source
    (written again each build: a page's source may have changed)."""
    if exception is not None or app.builder.format != "html":
        return
    seconds = getattr(app, "_course_download_seconds", None)
    if seconds is not None:
        LOGGER.info(f"chapter downloads converted and written in {seconds:.1f} s")
    outdir = Path(app.outdir)
    for _, (_, destination) in app.env.dlfiles.items():
        path = outdir / "_downloads" / destination
        if path.is_file():
            offline_copy(path)
    for docname in app.env.found_docs:   # the pages' sources (the chapters' notebooks: above)
        path = outdir / "_sources" / f"{docname}.md"
        if path.is_file():
            offline_copy(path)


def grading_substitutions(app, config):
    """``config-inited``: the grader's versions and the wheel's name as MyST substitutions."""
    from scripts.environment import grading_versions, wheel_name

    values = {f"grader_{name}": version for name, version in grading_versions().items()}
    config.myst_substitutions = {**config.myst_substitutions, **values,
                                 "wheel": wheel_name(app.srcdir)}


def launch_button_settings(app, config):
    """``config-inited``: ``launch_buttons`` and ``repository`` of ``_config.yml`` to the theme.

    All empty by default: the theme then shows no launch button and the page loads nothing.
    """
    book = yaml.safe_load((Path(app.srcdir) / "_config.yml").read_text(encoding="utf-8"))
    repository = book.get("repository") or {}
    config.html_theme_options = {
        **config.html_theme_options,
        "launch_buttons": book.get("launch_buttons") or {},
        "repository_url": repository.get("url") or "",
        "path_to_docs": repository.get("path_to_book") or "",
        "repository_branch": repository.get("branch") or "main",
    }


BIBLIOENTRY_ROLE = ' role="doc-biblioentry"'
HIDDEN_CELL_SUMMARY = '<summary aria-label="Toggle hidden content">'


def fix_aria(app, pagename, _templatename, context, doctree):
    """Bibliography entries as list items; code-cell toggles named by their visible text."""
    if "body" in context:
        body = context["body"].replace(BIBLIOENTRY_ROLE, ' role="listitem"')
        context["body"] = body.replace(HIDDEN_CELL_SUMMARY, "<summary>")


def disable_thebe(app):
    """Disconnect sphinx-thebe's handlers and drop its stylesheet (it was set up before us)."""
    for listeners in app.events.listeners.values():
        for listener in list(listeners):
            if getattr(listener.handler, "__module__", "").startswith("sphinx_thebe"):
                app.disconnect(listener.id)
    app.registry.css_files = [(name, attrs) for name, attrs in app.registry.css_files
                              if "thebe" not in (name or "")]


def notebook_to_execute(env, docname):
    """``(notebook, path, nb_config, read_fmt)`` if MyST-NB would execute the page, else None.

    Mirrors ``myst_nb.sphinx_.Parser.parse`` and ``myst_nb.core.execute.create_client``: the
    same reader and Markdown configuration, the same kernel aliases and notebook-level
    overrides, the same exclusion patterns, and only in ``cache`` mode.
    """
    path = Path(env.doc2path(docname))
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    nb_config = env.mystnb_config
    reader = create_nb_reader(str(path), env.myst_config, nb_config, text)
    if reader is None:
        return None
    notebook = reader.read(text)
    kernel_name = notebook.metadata.get("kernelspec", {}).get("name", None)
    if kernel_name is not None and nb_config.kernel_rgx_aliases:
        for rgx, alias in nb_config.kernel_rgx_aliases.items():
            if re.fullmatch(rgx, kernel_name):
                notebook.metadata["kernelspec"]["name"] = alias
                break
    if nb_config.metadata_key in notebook.metadata:
        overrides = nb_node_to_dict(notebook.metadata[nb_config.metadata_key])
        overrides.pop("output_folder", None)
        try:
            nb_config = nb_config.copy(**overrides)
        except Exception:  # MyST-NB warns about it when it reads the page
            return None
    if nb_config.execution_mode != "cache":
        return None
    if any(PurePosixPath(path.as_posix()).match(pattern)
           for pattern in nb_config.execution_excludepatterns):
        return None
    return notebook, path, nb_config, reader.read_fmt


def _one_thread_per_kernel():
    """Pool initializer: the kernels this worker starts inherit its environment."""
    os.environ.update(ONE_THREAD)


def _execute(source, cwd, timeout, allow_errors):
    """Run one notebook (nbformat JSON) in a pool worker; return what the parent caches.

    ``cwd`` None means a temporary folder (``execution_in_temp``), as in MyST-NB.
    """
    notebook = nbformat.reads(source, as_version=4)
    with TemporaryDirectory() if cwd is None else nullcontext(cwd) as folder:
        result = single_nb_execution(notebook, cwd=os.path.abspath(folder),
                                     allow_errors=allow_errors, timeout=timeout,
                                     meta_override=True, extra_arguments=KERNEL_ARGUMENTS)
    error = f"{type(result.err).__name__}" if result.err is not None else None
    return nbformat.writes(result.nb), result.time, error


def execute_in_parallel(app, env, docnames):
    """``env-before-read-docs``: put every page Sphinx will read into the execution cache.

    Runs the uncached notebooks among ``docnames`` in a process pool, longest code first so
    the two workers finish close together. Does nothing when fewer than two need running.
    """
    jobs = int(os.environ.get(JOBS_VARIABLE, "2") or 2)
    if jobs < 2 or getattr(env, "mystnb_config", None) is None:
        return
    cache = get_cache(env.mystnb_config.execution_cache_path)
    todo = []
    for docname in docnames:
        found = notebook_to_execute(env, docname)
        if found is None:
            continue
        try:
            cache.match_cache_notebook(found[0])
        except KeyError:
            todo.append((docname, *found))
    if len(todo) < 2:
        return  # nothing to gain: MyST-NB runs it (if any) while Sphinx reads the page
    code_size = {docname: sum(len(cell.source) for cell in notebook.cells
                              if cell.cell_type == "code")
                 for docname, notebook, *_ in todo}
    todo.sort(key=lambda item: -code_size[item[0]])
    jobs = min(jobs, len(todo))
    LOGGER.info(f"executing {len(todo)} notebooks, {jobs} at a time, before reading them")
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("fork"),
                             initializer=_one_thread_per_kernel) as pool:
        futures = {}
        for docname, notebook, path, nb_config, read_fmt in todo:
            record = (cache.add_nb_to_project(str(path), read_data=read_fmt)
                      if read_fmt is not None else cache.add_nb_to_project(str(path)))
            NbProjectRecord.remove_tracebacks([record.pk], cache.db)
            cwd = None if nb_config.execution_in_temp else str(path.parent)
            future = pool.submit(_execute, nbformat.writes(notebook), cwd,
                                 nb_config.execution_timeout, nb_config.execution_allow_errors)
            futures[future] = (docname, record.uri)
        for future in as_completed(futures):
            docname, uri = futures[future]
            try:
                source, seconds, error = future.result()
            except Exception as exc:  # a broken worker: leave the page to MyST-NB
                source, seconds, error = None, 0.0, f"{type(exc).__name__}: {exc}"
            if error is not None:
                LOGGER.info(f"{docname}: execution failed ({error}); it runs again when "
                            "Sphinx reads it, which reports the failing cell")
                continue
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.reads(source, as_version=4), uri,
                              data={"execution_seconds": seconds}),
                check_validity=False, overwrite=True)
            LOGGER.info(f"{docname}: executed in {seconds:.1f} s and cached")
    LOGGER.info(f"parallel execution took {time.perf_counter() - start:.1f} s")


SHARED_MODULE = "transformer_ref.counts"
BACKENDS = ("transformer_ref.numpy", "transformer_ref.torch")


def note_documented_module(app, what, name, obj, options, lines):
    """``autodoc-process-docstring``: remember which module autodoc is documenting.

    autodoc processes a module's own docstring before it filters the module's members, so
    ``skip_shared_members`` sees the module whose members are being chosen.
    """
    if what == "module":
        app.env.temp_data["api_module"] = name


def skip_shared_members(app, what, name, obj, skip, options):
    """``autodoc-skip-member``: a backend's re-export of ``counts`` is documented under counts."""
    if (app.env.temp_data.get("api_module") in BACKENDS
            and getattr(obj, "__module__", None) == SHARED_MODULE):
        return True
    return None


def converter_fingerprint():
    """SHA-256 of the download converter's source: a config value, so that a change to it
    makes Sphinx write every page (and so every chapter's download) again."""
    import hashlib

    return hashlib.sha256(Path(chapter_notebook.__file__).read_bytes()).hexdigest()


def setup(app):
    app.add_config_value("chapter_download_converter", converter_fingerprint(), "html")
    bib_style.register()
    disable_thebe(app)
    app.setup_extension("sphinx.ext.autodoc")  # its events are connected to below
    app.connect("autodoc-process-docstring", note_documented_module)
    app.connect("autodoc-skip-member", skip_shared_members)
    app.connect("env-before-read-docs", execute_in_parallel)
    app.connect("config-inited", grading_substitutions)
    app.connect("config-inited", launch_button_settings)
    app.connect("html-page-context", add_ipynb_download, priority=400)
    app.connect("html-page-context", fix_aria, priority=400)
    app.connect("html-page-context", point_button_at_download, priority=601)
    app.connect("html-page-context", write_ipynb_download, priority=900)
    app.connect("build-finished", offline_downloads)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
