"""Every place the grader binds to a dependency's insides, listed once, with the version it was
written for.

The grader replaces a few functions of its dependencies (nbgrader, jsonschema, pyzmq, PyTorch),
overrides private methods of their classes (nbclient's and nbgrader's executor, jupyter_client's
kernel manager, nbconvert's HTML exporter) and keeps some of their objects for a whole process
(a started kernel, a feedback exporter, a Dask worker's plugin). Each one is in :data:`PATCHES`:
what it changes (``target``, a dotted path into the dependency), which of the grader's objects
does it (``by``, a dotted path), the distribution and the exact version it was read against, and
why. ``tests/grader/test_patches.py`` fails when an installed version differs from the listed one
(an upgrade is a review of that entry: does the dependency still do what the patch assumes?) and
checks that each entry is applied where it says.

Kinds:

* ``replaces``: after ``install`` (a dotted path of the grader's function that does it; empty
  where importing ``by``'s module does), ``target`` is the grader's object, from ``by``'s module;
* ``overrides``: ``by``, a subclass of the dependency's class ``target``, overrides or calls
  its private methods ``names`` (or a public one whose behaviour it relies on);
* ``holds``: ``by`` keeps, for the whole process, an object that the dependency's ``target``
  holds for one run (``names``: its attributes that the grader reads or sets);
* ``hides``: the module ``target`` is marked absent (``sys.modules[target] = None``, by ``by``)
  so that the dependency's optional import of it in the module ``names[0]`` takes its path
  without it.

This module is a list: it imports none of the modules it names.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One binding to a dependency's insides (see the module's docstring for the kinds)."""

    kind: str          # "replaces" | "overrides" | "holds" | "hides"
    target: str        # the dependency's object, as a dotted path
    by: str            # the grader's object that replaces, overrides or holds it
    dependency: str    # the distribution (as pip names it) that defines ``target``
    version: str       # the exact version of ``dependency`` the patch was written for
    why: str           # one line
    install: str = ""  # the grader's function that applies a ``replaces`` patch
    names: tuple = ()  # the methods, attributes or module an ``overrides``, ``holds`` or ``hides``
    #                    patch is about


PATCHES = (
    Patch("replaces", "nbgrader.nbgraderformat.common.jsonschema",
          "autograder.worker.pipeline._SchemaValidators", "nbgrader", "0.9.6",
          "nbgrader builds a jsonschema validator for every cell's metadata: one per schema instead",
          install="autograder.worker.pipeline.validate_metadata_once_per_schema"),
    Patch("replaces", "nbgrader.api.Gradebook.__init__",
          "autograder.core.gradebook.keep_engines_in_nbgrader", "nbgrader", "0.9.6",
          "nbgrader opens a Gradebook (a new SQLAlchemy engine) per step: one engine per gradebook",
          install="autograder.core.gradebook.keep_engines_in_nbgrader"),
    Patch("replaces", "nbgrader.api.get_alembic_version", "autograder.core.nbgrader_config.alembic_head",
          "nbgrader", "0.9.6",
          "nbgrader runs the alembic command (slow, and absent without the venv on PATH): in-process",
          install="autograder.core.nbgrader_config.prepare_nbgrader"),
    Patch("replaces", "nbgrader.dbutil.upgrade", "autograder.core.nbgrader_config.alembic_upgrade",
          "nbgrader", "0.9.6", "the same migration as `alembic upgrade`, run in-process",
          install="autograder.core.nbgrader_config.prepare_nbgrader"),
    Patch("replaces", "nbgrader.server_extensions.formgrader.handlers.SubmissionHandler.write",
          "autograder.core.formgrader_policy.protect", "nbgrader", "0.9.6",
          "the formgrader's submission view gets a Content-Security-Policy for what it writes",
          install="autograder.core.formgrader_policy.protect"),
    Patch("hides", "rfc3987_syntax", "autograder", "jsonschema", "4.26.0",
          "an optional import that builds a grammar (seconds) for a format notebooks never use",
          names=("jsonschema._format",)),
    Patch("replaces", "zmq.Socket.bind", "autograder.kernel.boot.adopt_sockets", "pyzmq", "27.3.0",
          "in the sandboxed kernel, bind on the listening descriptors the worker passed in",
          install="autograder.kernel.boot.adopt_sockets"),
    Patch("replaces", "torch.nn.functional.scaled_dot_product_attention", "autograder.kernel.boot.install",
          "torch", "2.13.0", "in the sandboxed kernel, count SDPA calls (also torch._C._nn's and aten's)",
          install="autograder.kernel.boot.install"),
    Patch("hides", "debugpy", "autograder.kernel.boot.main", "ipykernel", "7.4.0",
          "in the sandboxed kernel, ipykernel starts without its debugger (a fifth of start-up)",
          names=("ipykernel.debugger",)),
    Patch("overrides", "nbclient.client.NotebookClient", "autograder.judge.execute.LimitedExecute",
          "nbclient", "0.11.0",
          "per-cell limits on the charged clock; a timeout answered by a late reply is not one",
          names=("_get_timeout", "_async_poll_for_reply", "_async_handle_timeout")),
    Patch("overrides", "nbgrader.preprocessors.Execute", "autograder.judge.execute.LimitedExecute",
          "nbgrader", "0.9.6",
          "its on_cell_executed adds the reply's error that no output names: not for a flooded cell",
          names=("on_cell_executed",)),
    Patch("overrides", "jupyter_client.manager.KernelManager",
          "autograder.judge.kernel_manager.SandboxedKernelManager", "jupyter_client", "8.10.0",
          "every kernel in the sandbox: private sockets, passed descriptors, its cgroup killed",
          names=("_async_pre_start_kernel", "_async_launch_kernel", "_async_wait",
                 "_async_cleanup_resources")),
    Patch("overrides", "nbconvert.exporters.html.HTMLExporter", "autograder.core.feedback_page.FeedbackExporter",
          "nbconvert", "7.17.2",
          "its from_notebook_node, on the private _init_resources, without the BeautifulSoup pass",
          names=("from_notebook_node", "_init_resources")),
    Patch("holds", "nbclient.client.NotebookClient", "autograder.judge.execute.SpareKernel",
          "nbclient", "0.11.0",
          "the next notebook's kernel starts while one is graded: a kernel manager passes between executors",
          names=("km", "kc")),
    Patch("holds", "nbgrader.converters.generate_feedback.GenerateFeedback",
          "autograder.core.feedback_page._ProcessExporter", "nbgrader", "0.9.6",
          "one feedback exporter per process: a new one compiles its templates again (a second)",
          names=("exporter", "preprocessors")),
    Patch("holds", "distributed.worker.Worker", "autograder.worker.plugin._ProcessRun", "distributed", "2026.8.0",
          "which run's plugin (and spare kernel) a Dask worker process has; plugins found by name",
          names=("plugins",)),
)
