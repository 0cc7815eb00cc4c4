"""The bibliography's pybtex style (``bibtex_default_style: course`` in ``_config.yml``).

pybtex's ``plain`` style with two changes, registered as the pybtex plugin ``course``:

* **Author–year labels.** Each entry is labelled the way the chapters cite it with
  ``{cite}`` (sphinxcontrib-bibtex's ``author_year`` references): "Shazeer, 2019",
  "Katharopoulos et al., 2020", "Okabe and Ito, 2008", instead of a running number that no
  citation in the text shows.
* **A link on every entry.** ``plain`` already turns ``doi``, ``eprint`` (arXiv) and ``url``
  fields into links; this style writes them as short link texts ("doi:…", "arXiv:…", the
  host of a URL) and raises an error for an entry that has none of them, so the build fails
  instead of listing a reference a reader cannot follow.
"""

from urllib.parse import urlsplit

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.template import field, href, optional, sentence

STYLE_NAME = "course"
LINK_FIELDS = ("doi", "eprint", "url")


def surname(person):
    """A person's surname as plain text (``{\\L}ukasz``-style TeX resolved)."""
    return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render_as("text")


def author_year_label(entry):
    """``"Su et al., 2021"``: the text of a ``{cite}`` reference to ``entry``.

    One author: the surname; two: "A and B"; three or more (or "and others"): "A et al.".
    Entries without author or editor are labelled by their key.
    """
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [surname(person) for person in persons]
    if len(names) >= 3 or (len(names) == 2 and names[1] == "others"):
        who = f"{names[0]} et al."
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    elif names:
        who = names[0]
    else:
        who = entry.key
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    """pybtex label style: :func:`author_year_label` for every entry."""

    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            yield author_year_label(entry)


class CourseStyle(PlainStyle):
    """``plain`` with author–year labels and a required link (DOI, arXiv or URL) per entry."""

    default_label_style = AuthorYearLabels

    def format_entry(self, label, entry, bib_data=None):
        if not any(entry.fields.get(name) for name in LINK_FIELDS):
            raise ValueError(f"references.bib: entry {entry.key!r} has no doi, eprint or url "
                             "field; every reference must link to its source")
        return super().format_entry(label, entry, bib_data=bib_data)

    def format_web_refs(self, e):
        return sentence[
            optional[self.format_doi(e)],
            optional[self.format_eprint(e)],
            optional[self.format_url(e)],
        ]

    def format_url(self, e):
        url = e.fields.get("url", "")
        return href(field("url", raw=True))[urlsplit(url).hostname or url]


def register():
    """Make the style available to sphinxcontrib-bibtex as ``bibtex_default_style: course``."""
    register_plugin("pybtex.style.formatting", STYLE_NAME, CourseStyle)


__all__ = ["STYLE_NAME", "author_year_label", "AuthorYearLabels", "CourseStyle", "register"]
