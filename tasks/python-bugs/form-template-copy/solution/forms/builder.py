"""Create forms from shared templates."""

import copy

CONTACT_TEMPLATE = {
    "title": "Contact us",
    "fields": [{"name": "email", "required": True}],
    "meta": {"version": 1},
}


def new_form(template, title=None):
    """Return an independent form built from ``template``.

    The caller may freely modify the returned form; the template is never
    changed.
    """
    form = copy.deepcopy(template)
    if title is not None:
        form["title"] = title
    return form


def add_field(form, name, required=False):
    """Append a field to ``form`` and return the form."""
    form["fields"].append({"name": name, "required": required})
    return form
