import copy
import unittest

from forms.builder import CONTACT_TEMPLATE, add_field, new_form


class NewFormTests(unittest.TestCase):
    def setUp(self):
        self.snapshot = copy.deepcopy(CONTACT_TEMPLATE)

    def tearDown(self):
        CONTACT_TEMPLATE.clear()
        CONTACT_TEMPLATE.update(self.snapshot)

    def test_title_override(self):
        form = new_form(CONTACT_TEMPLATE, title="Support")
        self.assertEqual(form["title"], "Support")
        self.assertEqual(CONTACT_TEMPLATE["title"], "Contact us")

    def test_add_field_leaves_template_alone(self):
        add_field(new_form(CONTACT_TEMPLATE), "phone")
        self.assertEqual([f["name"] for f in new_form(CONTACT_TEMPLATE)["fields"]], ["email"])
        self.assertEqual(CONTACT_TEMPLATE, self.snapshot)

    def test_nested_edits_are_private(self):
        form = new_form(CONTACT_TEMPLATE)
        form["fields"][0]["required"] = False
        form["meta"]["version"] = 2
        self.assertEqual(CONTACT_TEMPLATE, self.snapshot)

    def test_forms_are_independent(self):
        first, second = new_form(CONTACT_TEMPLATE), new_form(CONTACT_TEMPLATE)
        add_field(first, "name", required=True)
        self.assertEqual(len(first["fields"]), 2)
        self.assertEqual(len(second["fields"]), 1)
