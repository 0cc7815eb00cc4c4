"""The only grader code that runs inside a student's sandboxed kernel: ``probe``.

The judge sends the probe's source into the kernel as text; it answers the judge's requests
(look up a name, call a function with trusted inputs) as JSON with ``.npy`` arrays. It imports
only the standard library and NumPy (and uses torch only if the student's code loaded it).
"""
