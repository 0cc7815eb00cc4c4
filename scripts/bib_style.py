"""The bibliography's pybtex style (``bibtex_default_style: course`` in ``_config.yml``).

pybtex's ``plain`` style with two changes, registered as the pybtex plugin ``course``:

* **Author–year labels.** Each entry is labelled the way the chapters cite it with
  ``{cite}`` (sphinxcontrib-bibtex's ``author_year`` references): "Shazeer, 2019",
  "Katharopoulos et al., 2020", "Okabe and Ito, 2008", instead of a running number that no
  citation in the text shows.
  Two entries with the same authors and year get "2023a", "2023b", and the citations in
  the text say so too: the ``course_author_year`` referencing style is sphinxcontrib-bibtex's
  ``author_year`` with the year read from the label.
* **A link on every entry.** ``plain`` already turns ``doi``, ``eprint`` (arXiv) and ``url``
  fields into links; this style writes them as short link texts ("doi:…", "arXiv:…", the
  host of a URL) and raises an error for an entry that has none of them, so the build fails
  instead of listing a reference a reader cannot follow.
"""

from collections import Counter
from dataclasses import dataclass
from string import ascii_lowercase
from urllib.parse import urlsplit

from pybtex.backends.plaintext import Backend as PlainTextBackend
from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.template import field, href, node, optional, sentence
from sphinxcontrib.bibtex.plugin import register_plugin as register_bibtex_plugin
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle
from sphinxcontrib.bibtex.style.referencing.basic_author_year import (
    BasicAuthorYearParentheticalReferenceStyle,
    BasicAuthorYearTextualReferenceStyle,
)
from sphinxcontrib.bibtex.style.template import join, join2, post_text, pre_text, reference

STYLE_NAME = "course"
REFERENCE_STYLE_NAME = "course_author_year"
LINK_FIELDS = ("doi", "eprint", "url")


# The plain-text backend, made once: ``render_as("text")`` looks the backend plugin up again
# on every call, and each look-up reads every installed package's entry points (5 s of a
# build for the bibliography's 367 author names).
PLAIN_TEXT = PlainTextBackend()


def surname(person):
    """A person's surname as plain text (``{\\L}ukasz``-style TeX resolved)."""
    return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render(PLAIN_TEXT)


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
    """pybtex label style: :func:`author_year_label`, with a, b, ... after the year when
    several entries would get the same label (in the bibliography's sorted order)."""

    def format_labels(self, sorted_entries):
        labels = [author_year_label(entry) for entry in sorted_entries]
        repeated = {label for label, n in Counter(labels).items() if n > 1}
        seen = Counter()
        for label in labels:
            if label in repeated:
                yield label + ascii_lowercase[seen[label]]
                seen[label] += 1
            else:
                yield label


@node
def label_year(children, data):
    """The year part of the cited entry's label: "2023a" where the label disambiguates."""
    assert not children
    return Text(data["formatted_entry"].label.rsplit(", ", 1)[-1])


class LabelYearParenthetical(BasicAuthorYearParentheticalReferenceStyle):
    """``{cite}`` / ``{cite:p}``: "Touvron et al., 2023a", the entry's label."""

    def inner(self, role_name):
        return join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text,
            reference[join(sep=self.author_year_sep)[
                self.person.author_or_editor_or_title(full="s" in role_name), label_year]],
            post_text,
        ]


class LabelYearTextual(BasicAuthorYearTextualReferenceStyle):
    """``{cite:t}``: "Touvron et al. [2023a]"."""

    def inner(self, role_name):
        return join(sep=self.text_reference_sep)[
            self.person.author_or_editor_or_title(full="s" in role_name),
            join[self.bracket.left,
                 join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
                     pre_text, reference[label_year], post_text],
                 self.bracket.right],
        ]


@dataclass
class CourseAuthorYearReferences(AuthorYearReferenceStyle):
    """sphinxcontrib-bibtex's ``author_year`` references with the year taken from the label."""

    def __post_init__(self):
        super().__post_init__()
        self.styles[:2] = [
            LabelYearParenthetical(bracket=self.bracket_parenthetical, person=self.person,
                                   author_year_sep=self.author_year_sep,
                                   pre_text_sep=self.pre_text_sep,
                                   post_text_sep=self.post_text_sep),
            LabelYearTextual(bracket=self.bracket_textual, person=self.person,
                             text_reference_sep=self.text_reference_sep,
                             pre_text_sep=self.pre_text_sep, post_text_sep=self.post_text_sep),
        ]
        self.role_style.update((name, style) for style in self.styles[:2]
                               for name in style.role_names())


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
    """Register ``bibtex_default_style: course`` (pybtex's registry) and
    ``bibtex_reference_style: course_author_year`` (sphinxcontrib-bibtex's)."""
    register_plugin("pybtex.style.formatting", STYLE_NAME, CourseStyle)
    register_bibtex_plugin("sphinxcontrib.bibtex.style.referencing", REFERENCE_STYLE_NAME,
                           CourseAuthorYearReferences)


__all__ = ["STYLE_NAME", "REFERENCE_STYLE_NAME", "author_year_label", "AuthorYearLabels",
           "CourseStyle", "CourseAuthorYearReferences", "register"]
