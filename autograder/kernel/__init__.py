"""The only grader code that runs inside a student's sandboxed kernel: ``boot`` and ``probe``.

``boot`` is the kernel's own command (the launcher runs its source with ``python -c``): before
ipykernel and any student code it adds the audit hook that counts calls of PyTorch's SDPA.
The judge sends the probe's source into the kernel as text; it answers the judge's requests
(look up a name, call a function with trusted inputs) as JSON with ``.npy`` arrays, with the
SDPA count around each call. Both import only the standard library and NumPy (and use torch
only if the student's code loaded it).
"""
