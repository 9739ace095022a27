"""Who may do what with a shared document."""

from dataclasses import dataclass


@dataclass
class User:
    name: str
    is_admin: bool = False


@dataclass
class Document:
    owner: str
    locked: bool = False
    public: bool = False


def can_view(user, doc):
    """Anyone may view public documents; otherwise only the owner or an admin."""
    return doc.public or user.is_admin or doc.owner == user.name


def can_edit(user, doc):
    """Admins may always edit. Owners may edit their own unlocked documents."""
    return user.is_admin or (doc.owner == user.name and not doc.locked)
