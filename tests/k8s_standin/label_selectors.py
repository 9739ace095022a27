"""Label selectors (`labelSelector`) and field selectors (`fieldSelector`) as the apiserver
parses them: comma-separated requirements that must all hold."""

import re

from api_status import bad_request

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_TERM = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^()]*)\)$")
_COMPARE_TERM = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*({_VALUE})$")
_EXISTS_TERM = re.compile(rf"^(!?)\s*({_KEY})$")


def _split_terms(text):
    """Splits on the commas outside parentheses (`a in (x,y),b` is two terms)."""
    terms, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += ch
    terms.append(current.strip())
    return [t for t in terms if t]


def parse_label_selector(text):
    """A list of predicates over a labels dict; an unparsable term is a 400 naming it."""
    predicates = []
    for term in _split_terms(text or ""):
        match = _SET_TERM.match(term)
        if match:
            key, op, values = match.group(1), match.group(3), match.group(4)
            allowed = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                predicates.append(lambda labels, k=key, a=allowed: labels.get(k) in a)
            else:
                predicates.append(lambda labels, k=key, a=allowed: labels.get(k) not in a)
            continue
        match = _COMPARE_TERM.match(term)
        if match:
            key, op, value = match.group(1), match.group(3), match.group(4)
            if op == "!=":
                predicates.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                predicates.append(lambda labels, k=key, v=value: labels.get(k) == v)
            continue
        match = _EXISTS_TERM.match(term)
        if match:
            negate, key = match.group(1) == "!", match.group(2)
            predicates.append(lambda labels, k=key, n=negate: (k in labels) != n)
            continue
        raise bad_request(f"unable to parse requirement: invalid label selector term {term!r}")
    return lambda labels: all(p(labels) for p in predicates)


_POD_FIELDS = {
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "status.phase": lambda pod: pod["status"].get("phase", ""),
    "spec.nodeName": lambda pod: pod["spec"].get("nodeName", ""),
    "spec.restartPolicy": lambda pod: pod["spec"].get("restartPolicy", ""),
}


def parse_field_selector(text):
    """A predicate over a pod; fields the apiserver does not index for pods are a 400."""
    predicates = []
    for term in _split_terms(text or ""):
        match = re.match(r"^([A-Za-z.]+)\s*(==|!=|=)\s*(.*)$", term)
        if not match:
            raise bad_request(f"invalid selector: {term!r}; can't understand {term!r}")
        field, op, value = match.group(1), match.group(2), match.group(3)
        if field not in _POD_FIELDS:
            raise bad_request(f'field label not supported: {field}')
        get = _POD_FIELDS[field]
        if op == "!=":
            predicates.append(lambda pod, g=get, v=value: g(pod) != v)
        else:
            predicates.append(lambda pod, g=get, v=value: g(pod) == v)
    return lambda pod: all(p(pod) for p in predicates)
