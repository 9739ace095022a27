import unittest

from perms.policy import Document, User, can_edit, can_view

ADMIN = User("root", is_admin=True)
ALICE = User("alice")
BOB = User("bob")


class EditTests(unittest.TestCase):
    def test_admin_edits_any_document(self):
        self.assertTrue(can_edit(ADMIN, Document(owner="alice")))
        self.assertTrue(can_edit(ADMIN, Document(owner="alice", locked=True)))

    def test_owner_edits_unlocked(self):
        self.assertTrue(can_edit(ALICE, Document(owner="alice")))

    def test_owner_cannot_edit_locked(self):
        self.assertFalse(can_edit(ALICE, Document(owner="alice", locked=True)))

    def test_stranger_cannot_edit(self):
        self.assertFalse(can_edit(BOB, Document(owner="alice")))
        self.assertFalse(can_edit(BOB, Document(owner="alice", public=True)))


class ViewTests(unittest.TestCase):
    def test_view(self):
        self.assertTrue(can_view(BOB, Document(owner="alice", public=True)))
        self.assertFalse(can_view(BOB, Document(owner="alice")))
        self.assertTrue(can_view(ADMIN, Document(owner="alice")))
