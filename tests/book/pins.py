"""The pins of a requirements file, and those that hold on a platform (PEP 508 markers)."""

from packaging.markers import Marker

from scripts.environment import canonical


def requirement_lines(text):
    """``(canonical name, version, marker or None)`` of each ``name==version`` line of ``text``."""
    from packaging.requirements import Requirement

    found = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            specifiers = list(requirement.specifier)
            if len(specifiers) != 1 or specifiers[0].operator != "==":
                raise ValueError(f"not one exact pin (name==version): {line!r}")
            (specifier,) = specifiers
            found.append((canonical(requirement.name), specifier.version,
                          str(requirement.marker) if requirement.marker else None))
    return found


def pins_where(text, environment=None):
    """``{canonical name: version}`` of the lines of requirements ``text`` whose marker holds in
    the PEP 508 ``environment`` (a dict of marker variables; default: this interpreter's)."""
    return {name: version for name, version, marker in requirement_lines(text)
            if marker is None or Marker(marker).evaluate(environment)}
