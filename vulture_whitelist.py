# Names that vulture (the dead-code check of `make lint`, configured in pyproject.toml
# [tool.vulture]) cannot see used, because something other than the code it reads uses them:
# a dependency calls them by name, a configuration names them in a string, a chapter or a
# notebook calls them. Each with the reason. Never executed: vulture only reads the names.
# A name that is really dead is removed, not listed here.

# -- traitlets configuration: `c.Class.trait = value`, read by nbgrader/nbconvert/jupyter_client
_.source_directory, _.release_directory, _.submitted_directory  # nbgrader's CourseDirectory
_.autograded_directory, _.feedback_directory  # nbgrader's CourseDirectory
_.autograde_preprocessors  # nbgrader's Autograde
_.interrupt_on_timeout, _.raise_on_iopub_timeout, _.iopub_timeout  # nbclient's executor
_.preserve_nb_metadata_mask  # nbgrader's ClearMetadata
_.sanitize_html, _.skip_svg_encoding  # nbconvert's HTMLExporter
_.interrupt_mode  # jupyter_client's kernel spec

# -- methods and signatures a dependency calls
_.format_kernel_cmd  # jupyter_client's KernelManager builds the kernel's command with it
_._get_timeout  # nbclient's executor asks it each cell's timeout
_.preprocess_cell  # nbconvert's Preprocessor calls it per cell
InertOutputs, markdown2html  # named by dotted path in core/sanitize.py's nbconvert configuration
_.initialize, _.set_default_headers, _.write_error, _.get_login_url, _.post  # tornado handlers
worker  # Dask calls a WorkerPlugin's setup/teardown with worker= (a keyword: the name is fixed)
frame  # a signal handler's (signum, frame)
_.format_labels, _.format_web_refs, _.default_label_style  # pybtex's style plugin interface
_.required_arguments, _.optional_arguments  # docutils directive attributes
_._repr_html_  # IPython's rich display
__getattr__  # PEP 562 module attribute lookup (transformer_ref's lazy torch backend)

# -- worker entry points the host names by module and attribute, never imports
# (autograder/core/grading_run.py:call_by_name, autograder/host/cluster.py:PluginByName)
GradingPlugin, grade_task  # autograder/worker/plugin.py, built and called on each Dask worker

# -- assigned for a dependency to read
_.get_alembic_version  # nbgrader.api's, replaced (listed in autograder/core/patches.py)
_.execution_count  # a notebook cell's field, written for nbformat
_.compress_type  # zipfile.ZipInfo's field, written for the wheel
_.released  # a column of the service's journal, mirrored by its dataclass

# -- called from outside the Python that vulture reads
SelfCheck  # the student version's self-check cell (from the wheel in release/selfcheck/)
draw_block_diagram  # chapters 04 and 05
_.load_params, _.fork, _.free_blocks, _.n_free_blocks, _.n_tokens, _.fragmentation  # the library's API (chapter 06c, tests/library)
PATCHES, _.dependency  # autograder/core/patches.py is a list: tests/grader/test_patches.py reads it
_.round_trips  # the judge transport's request count, which the judge's tests observe

# -- fields of the course's typed records that production code does not read
_.checks  # core/assignments.py: the checks module of each assignment, which the check tests import
_.original_name  # worker/intake.py: Intake names the file it graded (the record's contract; tests read it)
